// The worker state machine in one process: ranks are threads, the supervisor is the real
// control::Scheduler over an in-memory store, collectives run over shared memory
// (tests/testing/). Resize, handoff, park/wake, pause/resume, a peer dying, and the
// transition table — each in milliseconds, CPU LibTorch.
#include "testing/in_memory_control.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <torch/torch.h>

#include "gpurun/worker/worker_state.hpp"

using namespace std::chrono_literals;
using gpurun::Runtime;
using gpurun::WorkerState;
using gpurun::control::Config;
using gpurun::control::Decision;
using gpurun::control::ParkMode;
using gpurun::testing::InProcessComms;
using gpurun::testing::ThreadJob;

namespace {

/// Closed until open(); wait() blocks until then (another thread's action), at most `limit`
/// so that a test that never opens it fails instead of hanging.
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

constexpr int64_t kSamples = 64;
constexpr int64_t kMicro = 8;
/// A slot's 10th and 11th collectives (3 slots, after the start's handoff and checksum): the
/// gradient all-reduces of epoch 0's first and second steps (of 24, 24 and 16 samples).
constexpr int64_t kFirstStepAt = 10;

Config config(std::vector<int> active, ParkMode mode = ParkMode::kRelease, int64_t every = 0) {
  Config c;
  c.active_gpus = std::move(active);
  c.park_mode = mode;
  if (every > 0) c.boundary = {.every_epoch = false, .every_steps = every};
  return c;
}

/// What one rank's process saw.
struct RankLog {
  int gpu = -1;
  int pid = -1;
  bool left = false;
  bool joining = false;     // rt.joining() when it started
  bool finite = false;      // every parameter finite at the end
  int64_t epochs_done = 0;  // epoch bodies run to the end (not left in them)
  uint64_t final_checksum = 0;
  std::string checksum_error;  ///< state_checksum() after leaving
  /// checksum at the top of the first epoch body of each generation it trained in
  std::map<int64_t, uint64_t> first_of_generation;
};

/// A small AdamW regression every rank trains; results per process in `logs`.
struct Trainer {
  int64_t epochs = 3;
  torch::Tensor x, y;
  std::mutex mu;
  std::vector<RankLog> logs;
  /// Called at the top of every epoch body (tests: hold a rank until something happened).
  std::function<void(Runtime&, int64_t epoch)> before_epoch;
  /// Called before the model is built (tests: a warm joiner's start-up).
  std::function<void(Runtime&)> before_build;
  /// The cheap-joiner recipe, made visible: a rank with rt.joining() fills its fresh model
  /// with NaN instead of keeping its init (the handoff must overwrite every value).
  bool poison_when_joining = true;

  Trainer() {
    torch::manual_seed(7);
    x = torch::randn({kSamples, 8});
    y = torch::randn({kSamples, 4});
  }

  void operator()(Runtime& rt) {
    RankLog log;
    log.gpu = rt.gpu_id();
    if (before_build) before_build(rt);
    torch::nn::Linear model(8, 4);  // initialised differently per thread: the start broadcast
    log.joining = rt.joining();
    if (poison_when_joining && log.joining) {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.fill_(std::numeric_limits<float>::quiet_NaN());
    }
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    rt.track(*model, opt);
    rt.sampler(kSamples, {.seed = 5});
    for (int64_t epoch : rt.epochs(epochs)) {
      if (before_epoch) before_epoch(rt, epoch);
      if (!log.first_of_generation.count(rt.generation()))
        log.first_of_generation[rt.generation()] = rt.state_checksum();
      for (const gpurun::Step& step : rt.steps(kMicro)) {
        opt.zero_grad();
        for (size_t i = 0; i < step.micro_batches.size(); ++i) {
          const auto idx = torch::tensor(step.micro_batches[i], torch::kLong);
          const auto loss =
              torch::mse_loss(model->forward(x.index_select(0, idx)), y.index_select(0, idx));
          (loss * step.weight(i)).backward();
        }
        rt.all_reduce_gradients();
        opt.step();
      }
      if (rt.left()) break;  // the documented check: a leaver skips the rest of the body
      rt.all_reduce_sum({1.0});
      ++log.epochs_done;
    }
    log.left = rt.left();
    // A leaver's tracked tensors are freed (both park modes): only a pause's snapshot source
    // or a leaving handoff source knows the checksum it left with.
    try {
      log.final_checksum = rt.state_checksum();
    } catch (const gpurun::Error& e) {
      log.checksum_error = e.what();
    }
    log.finite = true;
    for (const auto& p : model->parameters())
      log.finite = log.finite && p.isfinite().all().item<bool>();
    std::lock_guard<std::mutex> lock(mu);
    logs.push_back(log);
  }

  std::vector<RankLog> of(int gpu) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<RankLog> out;
    for (const auto& l : logs)
      if (l.gpu == gpu) out.push_back(l);
    return out;
  }
};

ThreadJob::Options job_options(Config c, const std::string& name) {
  ThreadJob::Options o;
  o.slots = {0, 1};
  o.config = std::move(c);
  o.snapshot_path = (std::filesystem::temp_directory_path() /
                     ("gpurun-inprocess-" + name + "-" + std::to_string(::getpid()) + ".snap"))
                        .string();
  o.runtime.comm_timeout = 10s;
  o.wait_timeout = 10s;
  return o;
}

/// The resize decisions, one per generation made (a resize is written both as the round's
/// decision and as the new generation's start record).
std::vector<Decision> resizes(ThreadJob& job) {
  std::vector<Decision> out;
  for (const Decision& d : job.supervisor().decisions())
    if (d.kind == Decision::Kind::kResize &&
        std::none_of(out.begin(), out.end(),
                     [&](const Decision& o) { return o.generation == d.generation; }))
      out.push_back(d);
  return out;
}

/// "FROM->TO FROM->TO ..." of every state change of the processes of `gpu`.
std::string moves(ThreadJob& job, int gpu) {
  std::string out;
  for (const auto& c : job.state_changes(gpu)) {
    if (!out.empty()) out += ' ';
    out += std::string(gpurun::to_string(c.from)) + "->" + gpurun::to_string(c.to);
  }
  return out;
}

struct OneThread {
  OneThread() { torch::set_num_threads(1); }
} const one_thread;

}  // namespace

TEST_CASE("in-process: shrink 2 -> 1, grow 1 -> 2 (release mode): the joiner gets the state") {
  Trainer t;
  t.epochs = 4;
  ThreadJob job(job_options(config({0, 1}), "resize"), std::ref(t));
  job.supervisor().load_config_at(0, 0, config({0}));
  job.supervisor().load_config_at(1, 0, config({0, 1}));
  // The joiner is warm (spawned at the boundary of epoch 1): rank 0 waits in epoch 2 until it
  // is ready, so that the boundary after epoch 2 admits it.
  t.before_epoch = [&](Runtime& rt, int64_t epoch) {
    if (rt.gpu_id() == 0 && epoch == 2)
      REQUIRE(job.supervisor().wait_for(
          [](const gpurun::control::Scheduler& s) { return s.slots().at(1).warm_ready; }, 10s));
  };
  job.start();
  REQUIRE(job.wait(20s));

  const auto r = resizes(job);
  REQUIRE(r.size() == 2);
  CHECK(r[0].active == std::vector<int>{0});
  CHECK(r[0].leavers == std::vector<int>{1});
  CHECK(r[1].active == std::vector<int>{0, 1});
  CHECK(r[1].joiners == std::vector<int>{1});
  CHECK(r[1].state_source.gpu == 0);

  for (const auto& x : job.exits()) CHECK_MESSAGE(x.clean, x.gpu << ": " << x.how);
  const auto s0 = t.of(0), s1 = t.of(1);
  REQUIRE(s0.size() == 1);
  REQUIRE(s1.size() == 2);  // the leaver's process, then the joiner's
  CHECK(s1[0].left);
  CHECK_MESSAGE(s1[0].checksum_error.find("its tracked tensors are freed") != std::string::npos,
                s1[0].checksum_error);
  const RankLog& leaver = s1[0].left ? s1[0] : s1[1];
  const RankLog& joiner = s1[0].left ? s1[1] : s1[0];
  CHECK(leaver.left);
  CHECK(leaver.epochs_done == 1);  // left at the end of epoch 0: its loop ended there
  CHECK_FALSE(joiner.left);
  // joining(): rank 0 at the start is the state the others receive; rank 1 at the start and
  // the warm joiner receive it — their NaN-filled models train to the source's state.
  CHECK_FALSE(s0[0].joining);
  CHECK(leaver.joining);
  CHECK(joiner.joining);
  CHECK(s0[0].finite);
  CHECK(joiner.finite);
  CHECK_FALSE(s0[0].left);
  CHECK(s0[0].epochs_done == 4);
  // The handoff: the joiner starts generation 2 with the source's model + optimizer state,
  // and the two replicas stay equal to the end.
  REQUIRE(joiner.first_of_generation.count(2));
  CHECK(joiner.first_of_generation.at(2) == s0[0].first_of_generation.at(2));
  CHECK(joiner.final_checksum == s0[0].final_checksum);
  // The leaver: REJOINING -> ACTIVE -> OFFLOADING -> EXITED, no process exit inside the loop.
  // ... then the joiner's process: REJOINING -> ACTIVE.
  CHECK(moves(job, 1) ==
        "REJOINING->ACTIVE ACTIVE->OFFLOADING OFFLOADING->EXITED REJOINING->ACTIVE");
}

TEST_CASE("in-process: after a shrink to the second slot its environment says rank 0 of 1") {
  // What a program reads (os.environ / getenv) is the current generation's, not the slot's:
  // after active_gpus = [1] the survivor is rank 0 of 1 (docs/cli.md#in-elastic-mode---config).
  const auto get = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "(unset)");
  };
  std::map<std::string, std::string> saved;
  for (const char* n : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE"})
    saved[n] = get(n);
  ::setenv("RANK", "1", 1);  // what gpurun's spawn gave slot 1 in generation 0
  ::setenv("WORLD_SIZE", "2", 1);
  Trainer t;
  t.epochs = 3;
  ThreadJob::Options o = job_options(config({0, 1}), "env");
  o.export_env_slot = 1;
  ThreadJob job(o, std::ref(t));
  job.supervisor().load_config_at(0, 0, config({1}));
  std::map<int64_t, std::string> seen;  // epoch -> what slot 1 read at its top
  t.before_epoch = [&](Runtime& rt, int64_t epoch) {
    if (rt.gpu_id() != 1) return;
    seen[epoch] = fmt::format("RANK={} WORLD_SIZE={} LOCAL_RANK={} LOCAL_WORLD_SIZE={} rank()={}",
                              get("RANK"), get("WORLD_SIZE"), get("LOCAL_RANK"),
                              get("LOCAL_WORLD_SIZE"), rt.rank());
  };
  job.start();
  REQUIRE(job.wait(20s));
  CHECK(seen[0] == "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 rank()=1");
  CHECK(seen[1] == "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 rank()=0");
  CHECK(seen[2] == "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 rank()=0");
  CHECK(get("GROUP_RANK") == "0");
  CHECK(get("ROLE_WORLD_SIZE") == "1");
  for (const auto& [n, v] : saved) {
    if (v == "(unset)") {
      ::unsetenv(n.c_str());
    } else {
      ::setenv(n.c_str(), v.c_str(), 1);
    }
  }
}

TEST_CASE("in-process: park and wake in hold mode (one thread per slot for the whole run)") {
  Trainer t;
  ThreadJob job(job_options(config({0, 1}, ParkMode::kHold), "hold"), std::ref(t));
  job.supervisor().load_config_at(0, 0, config({0}, ParkMode::kHold));
  job.supervisor().load_config_at(1, 0, config({0, 1}, ParkMode::kHold));
  job.start();
  REQUIRE(job.wait(20s));
  const auto s0 = t.of(0), s1 = t.of(1);
  REQUIRE(s1.size() == 1);  // the same process parked and was woken
  CHECK_FALSE(s1[0].left);
  CHECK(s1[0].final_checksum == s0.at(0).final_checksum);
  CHECK(s1[0].first_of_generation.at(2) == s0.at(0).first_of_generation.at(2));
  CHECK(moves(job, 1) ==
        "REJOINING->ACTIVE ACTIVE->OFFLOADING OFFLOADING->PARKED PARKED->REJOINING "
        "REJOINING->ACTIVE");
  for (const auto& x : job.exits()) CHECK_MESSAGE(x.clean, x.gpu << ": " << x.how);
}

TEST_CASE("in-process: pause to [] and resume to [0, 1] from the host snapshot") {
  for (ParkMode mode : {ParkMode::kRelease, ParkMode::kHold}) {
    CAPTURE(gpurun::control::to_string(mode));
    Trainer t;
    ThreadJob job(job_options(config({0, 1}, mode), "pause"), std::ref(t));
    job.supervisor().load_config_at(0, 0, config({}, mode));
    job.start();
    // Paused: every slot PARKED (hold: parked), or in release mode a STANDBY (the leaver's
    // process gone, a standby waiting in its first device use for the resume).
    const auto want = mode == ParkMode::kRelease ? gpurun::control::SlotState::kStandby
                                                 : gpurun::control::SlotState::kParked;
    REQUIRE(job.supervisor().wait_for(
        [&](const gpurun::control::Scheduler& s) {
          if (s.generation() < 1) return false;
          for (const auto& [gpu, info] : s.slots())
            if (info.state != want) return false;
          return true;
        },
        10s));
    job.supervisor().load_config(config({0, 1}, mode));
    REQUIRE(job.wait(20s));
    const auto r = resizes(job);
    REQUIRE(!r.empty());
    CHECK(r[0].active.empty());
    const auto starts = job.supervisor().decisions();
    const auto resume = std::find_if(starts.begin(), starts.end(), [](const Decision& d) {
      return d.state_source.is_snapshot() && !d.active.empty();
    });
    REQUIRE(resume != starts.end());
    const int64_t g = resume->generation;
    // Every resumed rank starts from the snapshot: the state the source had when it paused.
    const auto s0 = t.of(0), s1 = t.of(1);
    const RankLog& a = s0.back();
    const RankLog& b = s1.back();
    REQUIRE(a.first_of_generation.count(g));
    REQUIRE(b.first_of_generation.count(g));
    CHECK(a.first_of_generation.at(g) == b.first_of_generation.at(g));
    if (mode == ParkMode::kRelease) {  // the source's process ended at the pause
      REQUIRE(s0.size() == 2);
      CHECK(s0.front().left);
      CHECK(s0.front().final_checksum == a.first_of_generation.at(g));  // what it paused with
    }
    CHECK(a.final_checksum == b.final_checksum);
    CHECK(a.finite);  // release: new processes, joining() true, NaN-filled before the resume
    CHECK(b.finite);
    CHECK(a.joining == (mode == ParkMode::kRelease));  // hold: the processes of the start
    // Epoch 0 before the pause, then 1 and 2 (hold mode: in the same process).
    CHECK(a.epochs_done == (mode == ParkMode::kHold ? 3 : 2));
    for (const auto& x : job.exits()) CHECK_MESSAGE(x.clean, x.gpu << ": " << x.how);
    std::filesystem::remove(job_options(config({}), "pause").snapshot_path);
  }
}

TEST_CASE("in-process: a peer dies at a collective; the survivor goes on alone") {
  Trainer t;
  ThreadJob job(job_options(config({0, 1}), "death"), std::ref(t));
  // Slot 1 dies at its 12th collective: after the start handoff, inside epoch 0's steps.
  job.comms().fail_at(1, 12, InProcessComms::Fault::kDie);
  job.start();
  REQUIRE(job.wait(20s));
  const auto r = resizes(job);
  REQUIRE(r.size() == 1);
  CHECK(r[0].active == std::vector<int>{0});
  CHECK(r[0].failed == std::vector<int>{1});
  for (const auto& x : job.exits()) {
    if (x.gpu == 1) {
      CHECK_FALSE(x.clean);
      CHECK(x.how.find("died") != std::string::npos);
    } else {
      CHECK_MESSAGE(x.clean, x.how);
    }
  }
  const auto s0 = t.of(0);
  REQUIRE(s0.size() == 1);
  CHECK_FALSE(s0[0].left);
  CHECK(s0[0].epochs_done == 3);
}

TEST_CASE("in-process: survivors a step apart after a death inside an all-reduce go on") {
  // Slots 0, 1, 2. Slot 0's gradient all-reduce of a step fails after every part was exchanged
  // (slot 1's completes: it takes the step), and slot 2 dies at its next collective. Slot 1 then
  // fails one step further on than slot 0: gpurun takes slot 1's state and position, slot 0
  // receives them, and both train to the end with one state (no "checksum mismatch"). At the
  // second step, slot 1's step in flight is the epoch's smaller last one: slot 0's ends with it.
  for (const int64_t at : {kFirstStepAt, kFirstStepAt + 1}) {
    CAPTURE(at);
    Trainer t;
    ThreadJob::Options o = job_options(config({0, 1, 2}), "apart" + std::to_string(at));
    o.slots = {0, 1, 2};
    ThreadJob job(std::move(o), std::ref(t));
    job.comms().fail_at(0, at, InProcessComms::Fault::kFailAfter);
    job.comms().fail_at(2, at + 1, InProcessComms::Fault::kDie);
    job.start();
    REQUIRE(job.wait(20s));
    const auto r = resizes(job);
    REQUIRE(r.size() == 1);
    CHECK(r[0].active == std::vector<int>{0, 1});
    CHECK(r[0].failed == std::vector<int>{2});
    CHECK(r[0].state_source.gpu == 1);
    CHECK(r[0].behind == std::vector<int>{0});
    for (const auto& x : job.exits())
      if (x.gpu != 2) CHECK_MESSAGE(x.clean, x.how);
    const auto s0 = t.of(0), s1 = t.of(1);
    REQUIRE(s0.size() == 1);
    REQUIRE(s1.size() == 1);
    CHECK(s0[0].epochs_done == 3);
    CHECK(s1[0].epochs_done == 3);
    CHECK(s0[0].finite);
    CHECK(s0[0].final_checksum == s1[0].final_checksum);
  }
}

TEST_CASE("in-process: a release-mode leaver at a step boundary: steps() and epochs() end") {
  Trainer t;
  ThreadJob job(job_options(config({0, 1}, ParkMode::kRelease, 2), "steps"), std::ref(t));
  job.supervisor().load_config_at(0, 2, config({0}, ParkMode::kRelease, 2));
  job.start();
  REQUIRE(job.wait(20s));
  const auto s1 = t.of(1);
  REQUIRE(s1.size() == 1);
  CHECK(s1[0].left);
  CHECK(s1[0].epochs_done == 0);  // the check after steps() skipped the rest of epoch 0
  const auto s0 = t.of(0);
  CHECK(s0.at(0).epochs_done == 3);
  for (const auto& x : job.exits()) {
    CHECK_MESSAGE(x.clean, x.how);
    if (x.gpu == 1) CHECK(x.state == WorkerState::kExited);
  }
}

TEST_CASE("worker state table: every pair walked; an illegal move throws naming both states") {
  const WorkerState all[] = {WorkerState::kActive, WorkerState::kOffloading, WorkerState::kParked,
                             WorkerState::kRejoining, WorkerState::kExited};
  int legal = 0;
  for (WorkerState from : all) {
    for (WorkerState to : all) {
      CAPTURE(gpurun::to_string(from));
      CAPTURE(gpurun::to_string(to));
      if (gpurun::worker_transition_allowed(from, to)) {
        CHECK(gpurun::worker_transition(from, to, "test") == to);
        ++legal;
      } else {
        try {
          gpurun::worker_transition(from, to, "test");
          FAIL("no error");
        } catch (const gpurun::InvariantError& e) {
          const std::string want =
              std::string(gpurun::to_string(from)) + " -> " + gpurun::to_string(to);
          CHECK(std::string(e.what()).find(want) != std::string::npos);
        }
      }
    }
  }
  CHECK(legal == 9);  // docs/worker-runtime.md: the 9 edges of the table
}

namespace {

/// Optimizer steps (and their sizes) that each rank's process took, epoch by epoch, with a
/// sampler of kSamples and the given drop_last.
struct StepCounter {
  bool drop_last = false;
  std::mutex mu;
  std::map<int, std::vector<std::vector<int64_t>>> global_samples;  // gpu -> epoch -> steps

  void operator()(Runtime& rt) {
    torch::nn::Linear model(8, 4);
    torch::optim::SGD opt(model->parameters(), 0.1);
    rt.track(*model, opt);
    rt.sampler(kSamples, {.seed = 5, .drop_last = drop_last});
    for (int64_t epoch : rt.epochs(3)) {
      (void)epoch;
      std::vector<int64_t> sizes;
      for (const gpurun::Step& step : rt.steps(kMicro)) sizes.push_back(step.global_samples);
      std::lock_guard<std::mutex> lock(mu);
      global_samples[rt.gpu_id()].push_back(sizes);
    }
  }
};

/// Sends this process's stderr to a file while alive; text() reads what was written.
struct StderrCapture {
  std::string path;
  int saved = -1;
  explicit StderrCapture(const std::string& name)
      : path((std::filesystem::temp_directory_path() /
              ("gpurun-inprocess-" + name + "-" + std::to_string(::getpid()) + ".err"))
                 .string()) {
    std::fflush(stderr);
    saved = ::dup(2);
    REQUIRE(saved >= 0);
    FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    ::dup2(::fileno(f), 2);
    std::fclose(f);
  }
  ~StderrCapture() { restore(); }
  void restore() {
    if (saved < 0) return;
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    saved = -1;
  }
  std::string text() {
    restore();
    std::ifstream in(path);
    std::ostringstream out;
    out << in.rdbuf();
    std::filesystem::remove(path);
    return out.str();
  }
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("in-process: [batch] global above the epoch without drop_last: rank 0 warns once") {
  Config c = config({0, 1});
  c.global_batch = 100000000000;  // what the user wrote; the parser now caps it, the struct not
  StepCounter t;
  StderrCapture err("global-warn");
  {
    ThreadJob job(job_options(c, "global-warn"), std::ref(t));
    job.start();
    REQUIRE(job.wait(20s));
    for (const auto& x : job.exits()) CHECK_MESSAGE(x.clean, x.how);
  }
  const std::string text = err.text();
  const std::string warning =
      "gpurun worker (slot 0): warning: [batch] global = 100000000000 is larger than the "
      "epoch's 64 samples: each epoch is one optimizer step of 64 samples";
  CHECK_MESSAGE(count_of(text, warning) == 1, text);  // rank 0 only, the first step only
  CHECK_MESSAGE(count_of(text, "[batch] global") == 1, text);
  // The behaviour the warning describes: every epoch is one step of the whole epoch.
  for (int gpu : {0, 1})
    CHECK(t.global_samples[gpu] == std::vector<std::vector<int64_t>>(3, {kSamples}));
}

TEST_CASE("in-process: [batch] global above the epoch with drop_last fails naming both numbers") {
  Config c = config({0, 1});
  c.global_batch = 65;  // one more than the epoch: every step would be dropped
  StepCounter t;
  t.drop_last = true;
  ThreadJob job(job_options(c, "global-drop"), std::ref(t));
  job.start();
  REQUIRE(job.wait(20s));
  const auto exits = job.exits();
  REQUIRE(exits.size() == 2);
  for (const auto& x : exits) {
    CHECK_FALSE(x.clean);
    CHECK_MESSAGE(x.how.find("[batch] global = 65 is larger than the epoch's 64 samples") !=
                      std::string::npos,
                  x.how);
    CHECK_MESSAGE(x.how.find("drop_last") != std::string::npos, x.how);
  }
  // No epoch ran a step (nor silently went through an epoch with none).
  for (const auto& [gpu, epochs] : t.global_samples) CHECK_MESSAGE(epochs.empty(), gpu);
}

TEST_CASE("in-process: [batch] global equal to the epoch with drop_last trains one full step") {
  Config c = config({0, 1});
  c.global_batch = kSamples;
  StepCounter t;
  t.drop_last = true;
  ThreadJob job(job_options(c, "global-equal"), std::ref(t));
  job.start();
  REQUIRE(job.wait(20s));
  for (const auto& x : job.exits()) CHECK_MESSAGE(x.clean, x.how);
  for (int gpu : {0, 1})
    CHECK(t.global_samples[gpu] == std::vector<std::vector<int64_t>>(3, {kSamples}));
}

namespace {
/// The resize that admitted `gpu` (nullopt when none).
std::optional<Decision> admitting(ThreadJob& job, int gpu) {
  for (const Decision& d : resizes(job))
    if (std::find(d.joiners.begin(), d.joiners.end(), gpu) != d.joiners.end()) return d;
  return std::nullopt;
}
}  // namespace

TEST_CASE("in-process: a slow warm joiner: the members pass boundaries while it starts up") {
  Trainer t;
  t.epochs = 6;
  ThreadJob::Options o = job_options(config({0, 1}), "warm");
  o.slots = {0, 1, 2};
  ThreadJob job(o, std::ref(t));
  job.supervisor().load_config_at(0, 0, config({0, 1, 2}));
  Gate go;
  int64_t continues_while_warming = 0;
  t.before_build = [&](Runtime& rt) {  // the warm joiner's start-up lasts until `go`
    if (rt.generation() >= 0) return;
    CHECK(rt.gpu_id() == 2);
    CHECK(rt.active_gpus().empty());
    CHECK(go.wait());
  };
  t.before_epoch = [&](Runtime& rt, int64_t epoch) {
    if (rt.gpu_id() != 0 || epoch != 3) return;
    job.supervisor().inspect([&](const gpurun::control::Scheduler& s) {
      CHECK(s.slots().at(2).state == gpurun::control::SlotState::kWarming);
      CHECK(s.active() == std::vector<int>{0, 1});
    });
    for (const Decision& d : job.supervisor().decisions())
      continues_while_warming += d.kind == Decision::Kind::kContinue;
    go.open();  // its start-up ends now; rank 0 trains on once it is ready
    REQUIRE(job.supervisor().wait_for(
        [](const gpurun::control::Scheduler& s) { return s.slots().at(2).warm_ready; }, 10s));
  };
  job.start();
  REQUIRE(job.wait(20s));
  // The boundaries of epochs 0, 1 and 2 were decided without it (it had been spawned at the
  // first one); the boundary after epoch 3, after it was ready, admitted it.
  CHECK(continues_while_warming == 3);
  const auto d = admitting(job, 2);
  REQUIRE(d);
  CHECK(d->epoch == 3);
  CHECK(d->active == std::vector<int>{0, 1, 2});
  for (const auto& x : job.exits()) CHECK_MESSAGE(x.clean, x.gpu << ": " << x.how);
  const auto s2 = t.of(2);
  REQUIRE(s2.size() == 1);  // one process: the warm one was admitted, not respawned
  CHECK(s2[0].final_checksum == t.of(0).at(0).final_checksum);
  CHECK(moves(job, 2) == "REJOINING->ACTIVE");
}

TEST_CASE("in-process: a warm joiner removed by an edit before it is ready is told to exit") {
  Trainer t;
  t.epochs = 4;
  ThreadJob::Options o = job_options(config({0, 1}), "warm-cancel");
  o.slots = {0, 1, 2};
  ThreadJob job(o, std::ref(t));
  job.supervisor().load_config_at(0, 0, config({0, 1, 2}));
  job.supervisor().load_config_at(1, 0, config({0, 1}));
  Gate go;
  t.before_build = [&](Runtime& rt) {
    if (rt.generation() < 0) CHECK(go.wait());
  };
  t.before_epoch = [&](Runtime& rt, int64_t epoch) {
    if (rt.gpu_id() == 0 && epoch == 2) go.open();
  };
  job.start();
  REQUIRE(job.wait(20s));
  CHECK(resizes(job).empty());  // the set stayed [0, 1]
  bool cancelled = false;
  for (const auto& x : job.exits()) {
    CHECK_MESSAGE(x.clean, x.gpu << ": " << x.how);
    if (x.gpu == 2) cancelled = x.left && x.join_generation == -1;
  }
  CHECK(cancelled);
  CHECK(t.of(0).at(0).epochs_done == 4);
  job.supervisor().inspect([](const gpurun::control::Scheduler& s) {
    CHECK(s.slots().at(2).state == gpurun::control::SlotState::kParked);
  });
}

TEST_CASE("in-process: the libraries' warm-up runs on its own thread; its failure is a warning") {
  // Runtime::Impl::start_warm_up: on CUDA the checksum's kernels and cuBLAS/cuDNN are set up
  // beside the start. A failure there (here: every call throws) must not end the process.
  Trainer t;
  t.epochs = 2;
  std::mutex mu;
  std::set<std::thread::id> rank_threads, warm_threads;
  std::atomic<int> calls{0};
  t.before_build = [&](Runtime&) {
    std::lock_guard<std::mutex> lock(mu);
    rank_threads.insert(std::this_thread::get_id());
  };
  ThreadJob::Options o = job_options(config({0, 1}), "warm-up");
  o.warm_up = [&](const at::Device&) {
    {
      std::lock_guard<std::mutex> lock(mu);
      warm_threads.insert(std::this_thread::get_id());
    }
    ++calls;
    throw std::runtime_error("no cuBLAS in this test");
  };
  ThreadJob job(std::move(o), std::ref(t));
  job.start();
  REQUIRE(job.wait(20s));
  for (const auto& x : job.exits()) CHECK_MESSAGE(x.clean, x.gpu << ": " << x.how);
  CHECK(calls.load() == 2);  // once per process
  REQUIRE(warm_threads.size() == 2);
  for (const auto& id : warm_threads) CHECK(rank_threads.count(id) == 0);
  const auto s0 = t.of(0), s1 = t.of(1);
  REQUIRE(s0.size() == 1);
  REQUIRE(s1.size() == 1);
  CHECK(s0[0].epochs_done == 2);
  CHECK(s0[0].final_checksum == s1[0].final_checksum);
}

TEST_CASE("in-process: the first step runs beside the warm-up and joins it at its end") {
  // Runtime::Impl::train_on does not wait for the warm-up (a standby's runs beside the
  // snapshot's copies: waiting cost a C++ ViT-H resume 374 ms); the first step's end joins it.
  // The warm-up here goes on only once the first epoch body has begun (else it gives up after
  // 10 s: a runtime that waits for it first never lets it), then ends only once the rank
  // waits for it (RuntimeSeams::warm_up_waited) or the second epoch began without waiting.
  Trainer t;
  t.epochs = 2;
  std::mutex mu;
  std::condition_variable cv;
  bool body_began = false, waited = false, second_epoch = false;
  std::atomic<bool> warm_saw_body{false};
  std::atomic<int> done{0};
  std::atomic<int> done_at_second_epoch{-1};
  t.before_epoch = [&](Runtime&, int64_t epoch) {
    if (epoch == 0) {
      std::lock_guard<std::mutex> lock(mu);
      body_began = true;
    } else if (epoch == 1) {
      done_at_second_epoch = done.load();
      std::lock_guard<std::mutex> lock(mu);
      second_epoch = true;
    }
    cv.notify_all();
  };
  ThreadJob::Options o = job_options(config({0}), "warm-up-join");
  o.slots = {0};
  o.warm_up = [&](const at::Device&) {
    std::unique_lock<std::mutex> lock(mu);
    warm_saw_body = cv.wait_for(lock, 10s, [&] { return body_began; });
    cv.wait_for(lock, 10s, [&] { return waited || second_epoch; });
    lock.unlock();
    ++done;
  };
  o.warm_up_waited = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      waited = true;
    }
    cv.notify_all();
  };
  ThreadJob job(std::move(o), std::ref(t));
  job.start();
  REQUIRE(job.wait(30s));
  for (const auto& x : job.exits()) CHECK_MESSAGE(x.clean, x.gpu << ": " << x.how);
  CHECK(warm_saw_body.load());              // not waited for before the first step
  CHECK(done_at_second_epoch.load() == 1);  // joined by the end of the first step
}

TEST_CASE("in-process: a boundary deadline runs on the test's clock: the rank not there is late") {
  gpurun::FakeClock clock;  // outlives the job: its deadlines run only in clock.advance()
  Config c = config({0, 1});
  c.boundary_deadline = 2s;
  ThreadJob::Options o = job_options(c, "deadline");
  o.clock = &clock;
  Gate late_one;  // rank 1 spends its first epoch in the program's own code until this opens
  ThreadJob job(o, [&](Runtime& rt) {
    torch::nn::Linear model(1, 1);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2));
    rt.track(*model, opt);
    for (int64_t epoch : rt.epochs(2))
      if (rt.gpu_id() == 1 && epoch == 0) CHECK(late_one.wait());
  });
  struct OpenAtEnd {  // a failed REQUIRE below lets rank 1 go on, so the job's threads end
    Gate& gate;
    ~OpenAtEnd() { gate.open(); }
  } open_at_end{late_one};
  job.start();
  // Rank 0's report at the end of epoch 0 opens the round and arms its deadline.
  REQUIRE(job.supervisor().wait_for(
      [](const gpurun::control::Scheduler& s) { return s.slots().at(0).last_boundary.has_value(); },
      10s));
  const auto wait = [&] {
    std::optional<gpurun::control::BoundaryWait> w;
    job.supervisor().inspect([&](const gpurun::control::Scheduler& s) { w = s.boundary_wait(); });
    return w;
  };
  clock.advance(2s - 1ms);
  CHECK_FALSE(wait());  // before the deadline nobody is late
  clock.advance(1ms);
  auto w = wait();
  REQUIRE(w);
  CHECK(w->waited == 2s);
  CHECK(w->reported == 1);
  CHECK(w->of == 2);
  REQUIRE(w->late.size() == 1);
  CHECK(w->late[0].gpu == 1);
  clock.advance(2s);  // the deadline repeats every deadline_s while it waits
  w = wait();
  REQUIRE(w);
  CHECK(w->waited == 4s);
  CHECK(job.supervisor().ignored_effects().empty());  // a running rank is waited for, not killed

  late_one.open();
  REQUIRE(job.wait(20s));
  CHECK_FALSE(wait());
  for (const auto& x : job.exits()) CHECK_MESSAGE(x.clean, x.gpu << ": " << x.how);
}
