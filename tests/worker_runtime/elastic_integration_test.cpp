// The worker runtime under the real gpurun (--device cpu, Gloo): elastic_trainer processes
// train an MLP while the test rewrites config.toml. After every boundary the replicas'
// state checksums must be identical (and equal to the state source's), every sample must be
// trained on exactly once per epoch across resizes, and with `[batch] global` the loss of an
// elastic run must match a fixed-size run's.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <boost/json.hpp>

#include "elastic_run.hpp"
#include "gpurun_process.hpp"

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace std::chrono_literals;
using gpurun::testing::slurp;
using gpurun::testing::write_file;

namespace {

const std::string kGpurun = GPURUN_BINARY;
const std::string kTrainer = GPURUN_TRAINER;
constexpr int64_t kSamples = 256;

using gpurun::testing::TempDir;

std::string config(const std::string& active, const std::string& mode = "release",
                   const std::string& extra = "") {
  return "active_gpus = " + active + "\n[park]\nmode = \"" + mode +
         "\"\n[boundary]\ndeadline_s = 60\n" + extra;
}

/// gpurun --device cpu --nproc N --config DIR/config.toml elastic_trainer DIR/out ARGS...
struct TrainRun : gpurun::testing::ElasticRun {
  /// `cfg` nullopt: a plain (static, not elastic) run.
  TrainRun(const fs::path& d, int nproc, const std::optional<std::string>& cfg,
           std::vector<std::string> trainer_args, std::map<std::string, std::string> env = {},
           std::vector<std::string> gpurun_args = {})
      : ElasticRun(kGpurun, d, nproc, cfg, command(d, trainer_args), gpurun_args, "cpu",
                   with_trace(d, env), "rt-test") {
    hang_guard = 120s;
    for (size_t i = 0; i + 1 < trainer_args.size(); ++i)
      if (trainer_args[i] == "--hold-at") {
        const std::string tag = hold_tag(trainer_args[i + 1]);
        holds_.emplace(tag, std::make_unique<gpurun::testing::GoFifo>(out() / ("go." + tag),
                                                                      /*create=*/false));
      }
  }
  /// Lets every trainer held at `tag` ("E.S" of --hold-at E:S) go on.
  void release(const std::string& tag) {
    REQUIRE(holds_.count(tag) == 1);
    holds_.at(tag)->release();
  }
  /// The go.E.S FIFO of each --hold-at E:S exists before the trainers start.
  static std::vector<std::string> command(const fs::path& d, std::vector<std::string> args) {
    fs::create_directories(d / "out");
    for (size_t i = 0; i + 1 < args.size(); ++i)
      if (args[i] == "--hold-at")
        gpurun::testing::GoFifo::make(d / "out" / ("go." + hold_tag(args[i + 1])));
    args.insert(args.begin(), {kTrainer, (d / "out").string()});
    return args;
  }
  static std::string hold_tag(std::string e_s) {  // "E:S" -> "E.S"
    std::replace(e_s.begin(), e_s.end(), ':', '.');
    return e_s;
  }
  static std::map<std::string, std::string> with_trace(const fs::path& d,
                                                       std::map<std::string, std::string> env) {
    env.emplace("GPURUN_TRACE_DIR", (d / "trace").string());
    env.emplace("GPURUN_COMM_TIMEOUT_MS", "20000");
    return env;
  }
  fs::path out() const { return dir / "out"; }

 private:
  std::map<std::string, std::unique_ptr<gpurun::testing::GoFifo>> holds_;

 public:
  std::string full_diag() const {
    std::string s = diag();
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(dir / "trace", ec))
      s += "--- " + f.path().filename().string() + " ---\n" + slurp(f.path());
    return s + "--- gpurun stdout ---\n" + slurp(dir / "gpurun.stdout");
  }

  /// Every trace line of every slot.
  std::vector<json::object> trace(const std::string& event) const {
    std::vector<json::object> out;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(dir / "trace", ec)) {
      std::istringstream in(slurp(f.path()));
      for (std::string line; std::getline(in, line);) {
        boost::system::error_code jec;
        auto v = json::parse(line, jec);
        if (!jec && v.is_object() && v.as_object().at("event").as_string() == event)
          out.push_back(v.as_object());
      }
    }
    return out;
  }

  /// Stops the trainers a couple of epochs ahead and waits for gpurun.
  int finish() {
    int64_t max_epoch = 0;
    for (auto& e : events("decision"))
      max_epoch = std::max<int64_t>(max_epoch, e["epoch"].as_int64());
    write_file(out() / "stop", std::to_string(max_epoch + 2));
    if (!wait(hang_guard)) FAIL("gpurun did not finish\n" << full_diag());
    return code();
  }

  /// epoch -> how many times each sample index was trained on in it (all ranks, all processes).
  std::map<int64_t, std::map<int64_t, int>> samples_per_epoch() const {
    std::map<int64_t, std::map<int64_t, int>> out;
    for (const auto& f : fs::directory_iterator(dir / "out")) {
      if (f.path().filename().string().rfind("indices.", 0) != 0) continue;
      std::istringstream in(slurp(f.path()));
      for (std::string line; std::getline(in, line);) {
        std::istringstream ls(line);
        int64_t epoch = 0, idx = 0;
        ls >> epoch;
        while (ls >> idx) ++out[epoch][idx];
      }
    }
    return out;
  }

  /// epoch -> mean training loss (from whichever slot was rank 0 in that epoch).
  std::map<int64_t, double> losses() const {
    std::map<int64_t, double> out;
    for (const auto& f : fs::directory_iterator(dir / "out")) {
      if (f.path().filename().string().rfind("loss.", 0) != 0) continue;
      std::istringstream in(slurp(f.path()));
      for (std::string line; std::getline(in, line);) {
        std::istringstream ls(line);
        int64_t epoch = 0;
        double loss = 0;
        ls >> epoch >> loss;
        CHECK_MESSAGE(out.count(epoch) == 0, "epoch " << epoch << " reported twice");
        out[epoch] = loss;
      }
    }
    return out;
  }

  /// Asserts: for every generation, every rank that traced a checksum traced the same one.
  /// Returns the number of generations checked.
  size_t check_checksums() const {
    std::map<int64_t, std::set<std::string>> sums;
    std::map<int64_t, int> count;
    for (auto& g : trace("generation")) {
      if (!g.at("checksum").is_string()) continue;
      const int64_t gen = g.at("generation").as_int64();
      sums[gen].insert(std::string(g.at("checksum").as_string()));
      ++count[gen];
    }
    for (const auto& [gen, s] : sums) {
      INFO("generation " << gen << " traced by " << count[gen] << " ranks");
      CHECK(s.size() == 1);
    }
    return sums.size();
  }

  /// Asserts: every epoch before `last` trained on each of the kSamples exactly once.
  void check_samples(int64_t first, int64_t last) const {
    auto per_epoch = samples_per_epoch();
    for (int64_t e = first; e < last; ++e) {
      INFO("epoch " << e);
      const auto& m = per_epoch[e];
      CHECK(m.size() == static_cast<size_t>(kSamples));
      int dup = 0;
      for (const auto& [idx, n] : m) {
        dup += n != 1;
        CHECK(idx >= 0);
        CHECK(idx < kSamples);
      }
      CHECK(dup == 0);
    }
  }

  std::string active_of(size_t n) { return json::serialize(wait_resize(n).at("active")); }

  /// For each (config active_gpus, expected decision active set): rewrites config.toml, waits
  /// for that resize decision, then for two boundaries of training (for a pause: its resize
  /// event, every participant's timing record in).
  void resize_through(const std::vector<std::pair<std::string, std::string>>& steps,
                      const std::string& mode) {
    size_t n = resizes().size();
    for (const auto& [active, want] : steps) {
      write_file(dir / "config.toml", config(active, mode));
      const json::object decision = wait_resize(++n);
      CHECK(json::serialize(decision.at("active")) == want);
      if (want != "[]") {
        wait_continues(2);
        continue;
      }
      const int64_t g = decision.at("generation").as_int64();
      wait_for("the pause's resize event (generation " + std::to_string(g) + ")", [this, g] {
        for (auto& e : events("resize"))
          if (e.at("generation").as_int64() == g) return true;
        return false;
      });
    }
  }
};

}  // namespace

TEST_CASE("release mode: shrink, swap, pause, resume, grow; identical state after every boundary") {
  TempDir tmp;
  TrainRun run(tmp.path, 3, config("[0, 1, 2]"), {"--epoch-ms", "150"});
  CHECK(run.active_of(1) == "[0,1,2]");
  run.wait_continues(1);
  const std::vector<std::pair<std::string, std::string>> steps = {
      {"[0, 1]", "[0,1]"},        // shrink: 2 leaves (its process exits)
      {"[2]", "[2]"},             // swap: 0 and 1 leave, 2 joins and gets the state from 0
      {"[]", "[]"},               // pause: the state goes to the host snapshot
      {"[0, 2]", "[0,2]"},        // resume from the snapshot
      {"[0, 1, 2]", "[0,1,2]"}};  // grow: 1 joins, receives from rank 0
  run.resize_through(steps, "release");
  const int rc = run.finish();
  INFO(run.full_diag());
  CHECK(rc == 0);
  // Every generation: the replicas' checksums agree (start, 4 resizes with members).
  CHECK(run.check_checksums() >= 5);
  // The swap's joiner got the state from a leaver: traced as a source-leaver.
  bool source_leaver = false;
  for (auto& g : run.trace("generation"))
    source_leaver |= g.at("role").as_string() == "source-leaver";
  CHECK(source_leaver);
  // Release mode: every leave ended its process.
  CHECK(run.trace("exit").size() >= 4);  // 2 at the shrink, 0 and 1 at the swap, 2 at the pause
  // The pause's leaver got a standby (slot 2's, started once the snapshot was written): it
  // mapped that snapshot while it waited, ahead of its go (docs/worker-runtime.md#standby).
  const auto mapped = run.trace("standby_mapped");
  REQUIRE(!mapped.empty());
  for (const auto& m : mapped) {
    CHECK(m.at("error").as_string() == "");
    CHECK(m.at("path").as_string().find(".snapshot") != std::string::npos);
  }
  // Each epoch saw each sample once, across every resize; training went on (loss fell).
  const auto losses = run.losses();
  REQUIRE(losses.size() >= 8);
  run.check_samples(0, losses.rbegin()->first + 1);
  CHECK(losses.rbegin()->second < losses.begin()->second);
  for (int64_t e = 0; e <= losses.rbegin()->first; ++e)
    CHECK_MESSAGE(losses.count(e), "epoch " << e);
  // The pause's host snapshot (in /dev/shm; the standby mapped it) is gone with gpurun. Its own
  // path: other cases' runs (ctest -j) may have theirs there now.
  for (const auto& m : mapped) {
    const std::string path(m.at("path").as_string());
    CHECK_MESSAGE(!fs::exists(path), path);
  }
}

TEST_CASE("hold mode: shrink, grow, pause, resume, swap; leavers park with their memory freed") {
  TempDir tmp;
  TrainRun run(tmp.path, 3, config("[0, 1, 2]", "hold"), {"--epoch-ms", "150"});
  run.wait_continues(1);
  const std::vector<std::pair<std::string, std::string>> steps = {
      {"[0]", "[0]"},            // shrink: 1 and 2 park
      {"[0, 1, 2]", "[0,1,2]"},  // grow: both woken, receive from 0
      {"[]", "[]"},              // pause: everyone parks, 0 writes the snapshot
      {"[1, 2]", "[1,2]"},       // resume two of them from the snapshot
      {"[0]", "[0]"}};           // swap: 0 woken, receives from 1; 1 and 2 park again
  run.resize_through(steps, "hold");
  const int rc = run.finish();
  INFO(run.full_diag());
  CHECK(rc == 0);
  CHECK(run.check_checksums() >= 5);
  // Every leave parked the process (memory freed) and every rejoin reused it: one pid per slot.
  const auto parked = run.trace("parked");
  CHECK(parked.size() == 7);  // 1,2 (shrink) + 0,1,2 (pause) + 1,2 (swap)
  for (auto& p : parked) CHECK(p.at("device_bytes").as_int64() == 0);
  std::map<int64_t, std::set<int64_t>> pids;  // slot -> pids seen
  for (auto& s : run.trace("start")) pids[s.at("gpu").as_int64()].insert(s.at("pid").as_int64());
  CHECK(pids.size() == 3);
  for (auto& [slot, p] : pids) CHECK(p.size() == 1);
  int joins = 0;
  for (auto& g : run.trace("generation")) joins += g.at("role").as_string() == "joiner";
  CHECK(joins == 5);  // 1,2 at the grow; 1,2 at the resume; 0 at the swap
  const auto losses = run.losses();
  REQUIRE(losses.size() >= 8);
  run.check_samples(0, losses.rbegin()->first + 1);
}

TEST_CASE(
    "[batch] global: the loss of an elastic run (step boundaries, 2->1->2) matches a fixed run") {
  // Same seed and global batch 64 (micro-batch 16): every optimizer step trains on the same
  // 64 samples whatever the world size, so the per-epoch loss may differ only by the order of
  // floating-point sums: tolerance 1e-4 relative.
  const std::string batch = "[batch]\nglobal = 64\n";
  TempDir fixed_dir, elastic_dir;
  std::map<int64_t, double> fixed, elastic;
  {
    TrainRun run(fixed_dir.path, 2, config("[0, 1]", "release", batch),
                 {"--epochs", "6", "--micro", "16"});
    REQUIRE(run.wait(120s));
    INFO(run.full_diag());
    CHECK(run.code() == 0);
    fixed = run.losses();
  }
  {
    auto cfg = [&](const std::string& active) {  // a boundary every 2 steps (4 steps/epoch)
      return "active_gpus = " + active + "\n[boundary]\nevery = 2\ndeadline_s = 60\n" + batch;
    };
    TrainRun run(elastic_dir.path, 2, cfg("[0, 1]"),
                 {"--epochs", "6", "--micro", "16", "--hold-at", "1:2", "--hold-at", "3:2"});
    // Shrink to [1] at the boundary after step 2 of epoch 1, grow back after step 2 of epoch 3:
    // both inside an epoch. The trainers wait there until the new config is loaded.
    auto change_at = [&](const std::string& tag, const std::string& active, size_t n) {
      run.wait_for("a trainer holding at " + tag, [&] {
        for (const auto& f : fs::directory_iterator(run.out()))
          if (f.path().filename().string().rfind("holding.", 0) == 0 && slurp(f.path()) == tag)
            return true;
        return false;
      });
      const size_t loads = run.events("config_loaded").size();
      const size_t readies = run.events("warm_ready").size();
      write_file(run.dir / "config.toml", cfg(active));
      run.wait_for("the config reload", [&] { return run.events("config_loaded").size() > loads; });
      // A grow's joiner is admitted once it is ready (a warm joiner): wait for it here.
      if (active == "[0, 1]")
        run.wait_for("the warm joiner ready",
                     [&] { return run.events("warm_ready").size() > readies; });
      run.release(tag);
      return run.wait_resize(n);
    };
    const auto shrink = change_at("1.2", "[1]", 2);
    CHECK(shrink.at("epoch").as_int64() == 1);
    CHECK(shrink.at("step").as_int64() == 2);
    const auto grow = change_at("3.2", "[0, 1]", 3);
    CHECK(grow.at("epoch").as_int64() == 3);
    CHECK(grow.at("step").as_int64() == 2);
    REQUIRE(run.wait(120s));
    INFO(run.full_diag());
    CHECK(run.code() == 0);
    elastic = run.losses();
    // Issue 43: after the shrink to [1] the survivor's environment and console prefix say
    // rank 0 of 1 (epoch 2 ran entirely in that generation); after the grow, rank 1 of 2.
    const std::string console = slurp(run.dir / "gpurun.stdout");
    CHECK(console.find("[rank0 gpu1]: elastic_trainer gpu 1: epoch 2 env RANK=0 WORLD_SIZE=1 "
                       "LOCAL_RANK=0\n") != std::string::npos);
    CHECK(console.find("[rank1]: elastic_trainer gpu 1: epoch 5 env RANK=1 WORLD_SIZE=2 "
                       "LOCAL_RANK=1\n") != std::string::npos);
    CHECK(console.find("[rank0]: elastic_trainer gpu 0: epoch 5 env RANK=0 WORLD_SIZE=2 "
                       "LOCAL_RANK=0\n") != std::string::npos);
    CHECK(run.check_checksums() >= 3);
    run.check_samples(0, 6);
  }
  REQUIRE(fixed.size() == 6);
  REQUIRE(elastic.size() == 6);
  for (int64_t e = 0; e < 6; ++e) {
    INFO("epoch " << e << ": fixed " << fixed[e] << ", elastic " << elastic[e]);
    CHECK(std::abs(fixed[e] - elastic[e]) <= 1e-4 * std::max(1.0, std::abs(fixed[e])));
  }
}

TEST_CASE("a worker killed at a boundary: the others go on without it, the event log says so") {
  TempDir tmp;
  // Three ranks: 6 steps an epoch (micro 16 x 3 over 256 samples); all held after epoch 1's
  // last step, so the kill lands between steps, not inside a collective. (A kill inside an
  // all-reduce can leave the survivors one optimizer step apart: their checksums then differ
  // and the state is declared lost; docs/worker-runtime.md#failures.)
  TrainRun run(tmp.path, 3, config("[0, 1, 2]"), {"--epoch-ms", "400", "--hold-at", "1:6"},
               {{"GPURUN_COMM_TIMEOUT_MS", "5000"}});
  run.wait_for("every rank holding at 1.6", [&] {
    for (int g = 0; g < 3; ++g) {
      const fs::path f = run.out() / ("holding." + std::to_string(g));
      if (!fs::exists(f) || slurp(f) != "1.6") return false;
    }
    return true;
  });
  int64_t victim = -1;
  for (auto& s : run.trace("start"))
    if (s.at("gpu").as_int64() == 1) victim = s.at("pid").as_int64();
  REQUIRE(victim > 0);
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(::kill(static_cast<pid_t>(victim), SIGKILL) == 0);
  run.release("1.6");
  const auto d = run.wait_resize(2);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  CHECK(json::serialize(d.at("failed")) == "[1]");
  CHECK(json::serialize(d.at("active")) == "[0,2]");
  CHECK(s < 10.0);
  run.wait_continues(2);  // training goes on with two ranks
  run.finish();
  INFO(run.full_diag());
  bool failed_logged = false;
  for (auto& e : run.events("worker_state"))
    failed_logged |= e.at("gpu").as_int64() == 1 && e.at("to").as_string() == "FAILED";
  CHECK(failed_logged);
  CHECK(run.check_checksums() >= 2);
}

TEST_CASE("without --config: a static data-parallel job (rank 0's state broadcast, one world)") {
  TempDir tmp;
  TrainRun run(tmp.path, 3, std::nullopt, {"--epochs", "3"});
  REQUIRE(run.wait(120s));
  INFO(run.full_diag());
  CHECK(run.code() == 0);
  // The three ranks start from different seeds; after the start broadcast they agree.
  CHECK(run.trace("generation").size() == 3);
  CHECK(run.check_checksums() == 1);
  CHECK(run.samples_per_epoch().size() == 3);
  run.check_samples(0, 3);
}

// ---- a death during a resize (docs/control-protocol.md#failures-during-a-resize) ------------
// The collective timeout is 60 s here: without gpurun's abort key the continuing rank would
// sit in the rendezvous that long; the bound asserted is a fraction of it.

namespace {
/// The pid of the `worker_started` event of `local_rank` after the latest resize decision.
/// The pid of the latest process started on `local_rank` (a warm joiner is started at the
/// config edit, before the decision that admits it).
int64_t latest_started(TrainRun& run, int local_rank) {
  int64_t pid = -1;
  run.wait_for("the joiner's worker_started event", [&] {
    for (auto& e : run.events("worker_started"))
      if (e.at("local_rank").as_int64() == local_rank) pid = e.at("pid").as_int64();
    return pid > 0;
  });
  return pid;
}

/// Index in the event log of the first event `name` for `gpu` matching `pred`; -1 when none.
long find_event(const std::vector<json::object>& events, const std::string& name,
                const std::function<bool(const json::object&)>& pred) {
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].at("event").as_string() == name && pred(events[i])) return static_cast<long>(i);
  return -1;
}
bool slot_to(const json::object& e, int gpu, const std::string& to) {
  return e.at("gpu").as_int64() == gpu && e.at("to").as_string() == to;
}

/// A joiner stuck before the set-up of the generation that admits it: with the members held at
/// boundary `tag` (their --hold-at), writes `cfg`, waits until the warm joiner of `gpu` is ready,
/// stops it (SIGSTOP: it will not read its admission), then lets the members go. The boundary
/// admits it and the members wait for it in the new generation's rendezvous. Returns its pid.
int64_t admit_stopped_joiner(TrainRun& run, const std::string& tag, const std::string& cfg,
                             int gpu) {
  run.wait_for("a trainer holding at " + tag, [&] {
    return fs::exists(run.out() / "holding.0") && slurp(run.out() / "holding.0") == tag;
  });
  write_file(run.dir / "config.toml", cfg);
  run.wait_for("the warm joiner ready", [&] {
    for (auto& e : run.events("warm_ready"))
      if (e.at("gpu").as_int64() == gpu) return true;
    return false;
  });
  const int64_t pid = latest_started(run, gpu);
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGSTOP) == 0);
  run.release(tag);
  return pid;
}
}  // namespace

TEST_CASE("a joiner killed during the resize's set-up: the continuing rank goes on at once") {
  TempDir tmp;
  // One rank: 16 steps an epoch; held before the boundary after epoch 2.
  TrainRun run(tmp.path, 3, config("[0]"), {"--epoch-ms", "300", "--hold-at", "2:16"},
               {{"GPURUN_COMM_TIMEOUT_MS", "60000"}});
  const int64_t joiner = admit_stopped_joiner(run, "2.16", config("[0, 1]"), 1);
  REQUIRE(json::serialize(run.wait_resize(2).at("joiners")) == "[1]");
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(::kill(static_cast<pid_t>(joiner), SIGKILL) == 0);
  const auto d = run.wait_resize(3);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  INFO(run.full_diag());
  CHECK(json::serialize(d.at("failed")) == "[1]");
  CHECK(json::serialize(d.at("active")) == "[0]");
  CHECK(d.at("state_source").as_int64() == 0);  // rank 0 kept the state all along
  CHECK(s < 20.0);                              // vs the 60 s rendezvous timeout
  CHECK(run.events("generation_abandoned").size() == 1);
  run.wait_continues(2);  // rank 0 trains on
  CHECK(run.finish() == 0);
  CHECK(run.check_checksums() >= 2);
}

TEST_CASE(
    "the only state holder killed during a resize: 'state lost' and a non-zero exit at once") {
  TempDir tmp;
  TrainRun run(tmp.path, 2, config("[0]"), {"--epoch-ms", "300", "--join-delay-ms", "3000"},
               {{"GPURUN_COMM_TIMEOUT_MS", "60000"}});
  run.wait_continues(2);
  int64_t source = -1;
  for (auto& st : run.trace("start"))
    if (st.at("gpu").as_int64() == 0) source = st.at("pid").as_int64();
  REQUIRE(source > 0);
  write_file(tmp.path / "config.toml", config("[0, 1]"));
  run.wait_resize(2);
  latest_started(run, 1);  // its handoff sleeps (--join-delay-ms)
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(::kill(static_cast<pid_t>(source), SIGKILL) == 0);
  const bool ended = run.wait(60s);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  INFO(run.full_diag());
  REQUIRE(ended);
  CHECK(run.code() != 0);
  CHECK(s < 20.0);
  const std::string err = slurp(tmp.path / "gpurun.stderr");
  CHECK(err.find("the training state is lost: gpu 0 (rank 0 of generation 1") != std::string::npos);
  CHECK(run.events("state_lost").size() == 1);
}

namespace {
/// The value of `name` in the environment of process `pid` (one of ours), "" when unset.
std::string env_of(int64_t pid, const std::string& name) {
  const std::string env = slurp("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = name + "=";
  for (size_t at = 0; at < env.size();) {
    const size_t end = std::min(env.find('\0', at), env.size());
    if (env.compare(at, key.size(), key) == 0)
      return env.substr(at + key.size(), end - at - key.size());
    at = end + 1;
  }
  return "";
}
}  // namespace

TEST_CASE("a pause whose snapshot cannot be written anywhere is refused: training goes on") {
  TempDir tmp;
  // Not prepared ahead (a prepared file would already sit where the blockers go): this is
  // the first write's own fallback.
  TrainRun run(tmp.path, 2, config("[0, 1]"), {"--epoch-ms", "200"},
               {{"GPURUN_SNAPSHOT_PREPARE", "0"}});
  run.wait_continues(2);
  int64_t pid = -1;
  for (auto& st : run.trace("start"))
    if (st.at("gpu").as_int64() == 0) pid = st.at("pid").as_int64();
  REQUIRE(pid > 0);
  // Directories where the snapshot files would go: both paths fail (EISDIR), as a full
  // /dev/shm and a full run directory would, without needing root for small filesystems.
  const fs::path primary = env_of(pid, "GPURUN_SNAPSHOT_PATH");
  const fs::path fallback = env_of(pid, "GPURUN_SNAPSHOT_FALLBACK_PATH");
  REQUIRE(!primary.empty());
  REQUIRE(!fallback.empty());
  struct Cleanup {  // also when a check fails: /dev/shm outlives the test
    fs::path a, b;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
      fs::remove_all(b, ec);
    }
  } cleanup{primary, fallback};
  fs::create_directories(primary / "blocker");
  fs::create_directories(fallback / "blocker");
  write_file(tmp.path / "config.toml", config("[]"));
  run.wait_for("pause_refused", [&] { return !run.events("pause_refused").empty(); });
  run.wait_continues(2);  // both ranks train on; nobody left
  INFO(run.full_diag());
  CHECK(run.resizes().size() == 1);
  const std::string err = slurp(tmp.path / "gpurun.stderr");
  CHECK(err.find("the pause is refused and training goes on with [0, 1]") != std::string::npos);
  CHECK(err.find(primary.string()) != std::string::npos);  // every attempt is named
  CHECK(err.find(fallback.string()) != std::string::npos);
  // Room again: the next boundary's attempt succeeds and the job pauses.
  fs::remove_all(primary);
  fs::remove_all(fallback);
  const auto pause = run.wait_resize(2);
  CHECK(json::serialize(pause.at("active")) == "[]");
  CHECK(pause.at("state_source").as_int64() == -1);
  CHECK(run.events("pause_refused").size() == 1);  // said once, tried at every boundary
  // Resume once both released leavers are gone (a resume edit while they still offload is
  // another case).
  run.wait_for("both leavers to exit", [&] { return run.events("worker_exited").size() == 2; });
  write_file(tmp.path / "config.toml", config("[0]"));
  run.wait_resize(3);
  run.wait_continues(2);
  CHECK(run.finish() == 0);
}

TEST_CASE("a leaver killed during the resize: the continuing rank does not wait for it") {
  TempDir tmp;
  TrainRun run(tmp.path, 2, config("[0, 1]"), {"--epoch-ms", "300"},
               {{"GPURUN_COMM_TIMEOUT_MS", "60000"}});
  run.wait_continues(2);
  int64_t leaver = -1;
  for (auto& st : run.trace("start"))
    if (st.at("gpu").as_int64() == 1) leaver = st.at("pid").as_int64();
  REQUIRE(leaver > 0);
  write_file(tmp.path / "config.toml", config("[0]"));
  run.wait_resize(2);
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(static_cast<pid_t>(leaver), SIGKILL);  // it may have exited already: fine
  run.wait_continues(2);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  INFO(run.full_diag());
  CHECK(s < 20.0);
  CHECK(run.resizes().size() == 2);  // no further decision was needed
  CHECK(run.events("state_lost").empty());
  CHECK(run.finish() == 0);
}

TEST_CASE("a leaving state source killed before its handoff (a swap): the state is lost, fast") {
  TempDir tmp;
  TrainRun run(tmp.path, 2, config("[0]"), {"--epoch-ms", "300", "--join-delay-ms", "3000"},
               {{"GPURUN_COMM_TIMEOUT_MS", "60000"}});
  run.wait_continues(2);
  int64_t source = -1;
  for (auto& st : run.trace("start"))
    if (st.at("gpu").as_int64() == 0) source = st.at("pid").as_int64();
  REQUIRE(source > 0);
  write_file(tmp.path / "config.toml", config("[1]"));  // gpu 0 hands off to gpu 1, then leaves
  const auto d = run.wait_resize(2);
  REQUIRE(json::serialize(d.at("leavers")) == "[0]");
  latest_started(run, 1);  // its handoff sleeps (--join-delay-ms)
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(::kill(static_cast<pid_t>(source), SIGKILL) == 0);
  const bool ended = run.wait(60s);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  INFO(run.full_diag());
  REQUIRE(ended);
  CHECK(run.code() != 0);
  CHECK(s < 20.0);
  // Which wording depends on which gpurun sees first: the source's death, or the joiner
  // reporting without the state after its handoff broke (seen in a clean-clone CI).
  const std::string err = slurp(tmp.path / "gpurun.stderr");
  CHECK((err.find("the training state is lost: gpu 0 (the state source of generation 1") !=
             std::string::npos ||
         err.find("the training state is lost: no process of generation 1 holds it") !=
             std::string::npos));
  CHECK(!run.events("state_lost").empty());
}

TEST_CASE("a swap whose joiner dies: the leaving source says so, gpurun says the state is lost") {
  TempDir tmp;
  TrainRun run(tmp.path, 2, config("[0]"), {"--epoch-ms", "300", "--hold-at", "2:16"},
               {{"GPURUN_COMM_TIMEOUT_MS", "60000"}});
  const int64_t joiner = admit_stopped_joiner(run, "2.16", config("[1]"), 1);
  run.wait_resize(2);
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(::kill(static_cast<pid_t>(joiner), SIGKILL) == 0);
  const bool ended = run.wait(60s);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  INFO(run.full_diag());
  REQUIRE(ended);
  CHECK(run.code() != 0);
  CHECK(s < 20.0);
  const std::string err = slurp(tmp.path / "gpurun.stderr");
  const std::string out = slurp(tmp.path / "gpurun.stdout") + err;
  CHECK(err.find("the training state is lost") != std::string::npos);
  CHECK(out.find("terminate called") == std::string::npos);            // no abort in the source
  CHECK(err.find("the job goes on without it") == std::string::npos);  // it does not
}

namespace {
/// Pauses a one-slot run (config.toml in `dir` says []: the `n`-th non-continue decision),
/// waits until every worker process it started has exited, returns the pause snapshot file.
fs::path pause_one_slot(TrainRun& run, const fs::path& dir, size_t n) {
  int64_t pid = -1;
  for (auto& st : run.trace("start")) pid = st.at("pid").as_int64();
  REQUIRE(pid > 0);
  const fs::path primary = env_of(pid, "GPURUN_SNAPSHOT_PATH");
  const fs::path fallback = env_of(pid, "GPURUN_SNAPSHOT_FALLBACK_PATH");
  write_file(dir / "config.toml", config("[]"));
  run.wait_resize(n);
  run.wait_for("the paused worker to exit", [&] {
    for (auto& st : run.trace("start"))
      if (::kill(static_cast<pid_t>(st.at("pid").as_int64()), 0) == 0) return false;
    return true;
  });
  const fs::path snap = fs::exists(primary) ? primary : fallback;
  REQUIRE(fs::exists(snap));
  return snap;
}

/// Resumes a paused one-slot run ([0]) whose snapshot the test spoiled: the job must end, non-zero,
/// with gpurun saying no member could take the state. Returns gpurun's output.
std::string resume_refused(TrainRun& run, const fs::path& dir) {
  write_file(dir / "config.toml", config("[0]"));
  const bool ended = run.wait(60s);
  INFO(run.full_diag());
  REQUIRE(ended);
  CHECK(run.code() != 0);
  const std::string all = slurp(dir / "gpurun.stderr") + slurp(dir / "gpurun.stdout");
  CHECK(all.find("could take it from the pause snapshot") != std::string::npos);
  return all;
}
}  // namespace

TEST_CASE("a corrupt pause snapshot: refused naming the file, then 'state lost', non-zero") {
  TempDir tmp;
  TrainRun run(tmp.path, 1, config("[0]"), {"--epoch-ms", "200"});
  run.wait_continues(2);
  const fs::path snap = pause_one_slot(run, tmp.path, 2);
  {
    std::fstream f(snap, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);  // in the tensors (the manifest comes first, ~2 KB here)
    f.write("\x5a\xa5\x5a\xa5\x5a\xa5\x5a\xa5", 8);  // in the payload (after the 128-byte header)
  }
  const std::string all = resume_refused(run, tmp.path);
  CHECK(all.find("payload checksum") != std::string::npos);
  CHECK(all.find(snap.string()) != std::string::npos);
}

TEST_CASE("an older pause snapshot copied over the current one: refused, no epoch runs twice") {
  // Issue 25 item 3: pause, keep a copy of that snapshot, resume, pause again a few epochs
  // later, copy the old file over the new one, resume: the decision names the second pause's
  // position, the file holds the first's; the resume must refuse it rather than train the
  // epochs between them again.
  TempDir tmp;
  TrainRun run(tmp.path, 1, config("[0]"), {"--epoch-ms", "200"});
  run.wait_continues(1);
  const fs::path old_copy = tmp.path / "old.snapshot";
  fs::copy_file(pause_one_slot(run, tmp.path, 2), old_copy);
  write_file(tmp.path / "config.toml", config("[0]"));
  run.wait_resize(3);
  run.wait_continues(3);
  fs::copy_file(old_copy, pause_one_slot(run, tmp.path, 4), fs::copy_options::overwrite_existing);
  const std::string all = resume_refused(run, tmp.path);
  CHECK(all.find("refusing to roll training back") != std::string::npos);
}

// ---- preemption (docs/cli.md#preemption, docs/worker-runtime.md#preemption) ------------------

namespace {
/// The first "epoch step" line of out/checkpoint.<gpu> ("" when none yet).
std::string first_checkpoint(const TrainRun& run, int gpu) {
  const fs::path p = run.out() / ("checkpoint." + std::to_string(gpu));
  if (!fs::exists(p)) return {};
  const std::string text = slurp(p);
  return text.substr(0, text.find('\n'));
}

/// The preempt signal, then SIGTERM: every rank sees the checkpoint request at the same
/// boundary, then stops at a boundary and exits 0 with the same state; gpurun exits 143.
void preempt_then_stop(TrainRun& run, int nproc) {
  run.wait_for("a trained epoch", [&] { return fs::exists(run.out() / "loss.0"); });
  ::kill(run.proc.pid, SIGUSR2);
  run.wait_for("the checkpoint request on every rank", [&] {
    for (int g = 0; g < nproc; ++g)
      if (first_checkpoint(run, g).empty()) return false;
    return true;
  });
  for (int g = 1; g < nproc; ++g) CHECK(first_checkpoint(run, g) == first_checkpoint(run, 0));
  ::kill(run.proc.pid, SIGTERM);
  if (!run.wait(60s)) FAIL("gpurun did not stop\n" << run.full_diag());
  INFO(run.full_diag());
  CHECK(run.code() == 128 + SIGTERM);
  // Every rank ended its loop at gpurun's request (no SIGTERM killed it) with one state.
  std::set<std::string> sums;
  for (int g = 0; g < nproc; ++g) {
    const fs::path p = run.out() / ("stopped." + std::to_string(g));
    REQUIRE(fs::exists(p));
    sums.insert(slurp(p));
  }
  CHECK(sums.size() == 1);
  int exits = 0;
  for (auto& e : run.events("worker_exited")) {
    CHECK(e.at("code").as_int64() == 0);
    ++exits;
  }
  CHECK(exits == nproc);
}
}  // namespace

TEST_CASE("preemption without --config: checkpoint at the same boundary, SIGTERM stops cleanly") {
  TempDir tmp;
  TrainRun run(tmp.path, 2, std::nullopt, {"--epochs", "100000", "--epoch-ms", "20"}, {},
               {"--stop-timeout", "50", "--grace-period", "5"});
  preempt_then_stop(run, 2);
}

TEST_CASE(
    "under Slurm a SIGTERM straight to the workers (as slurmstepd sends it) stops them at "
    "a boundary, not at once") {
  TempDir tmp;
  // SLURM_JOB_ID alone: the workers are in a Slurm job; gpurun is not made a Slurm step.
  TrainRun run(tmp.path, 2, std::nullopt, {"--epochs", "100000", "--epoch-ms", "20"},
               {{"SLURM_JOB_ID", "4242"}}, {"--stop-timeout", "50", "--grace-period", "5"});
  run.wait_for("a trained epoch", [&] { return fs::exists(run.out() / "loss.0"); });
  std::vector<pid_t> pids;
  for (auto& e : run.events("worker_started"))
    pids.push_back(static_cast<pid_t>(e.at("pid").as_int64()));
  REQUIRE(pids.size() == 2);
  for (pid_t p : pids) REQUIRE(::kill(p, SIGTERM) == 0);  // Slurm signals every process first
  ::kill(run.proc.pid, SIGTERM);                          // ... and gpurun
  if (!run.wait(60s)) FAIL("gpurun did not stop\n" << run.full_diag());
  INFO(run.full_diag());
  CHECK(run.code() == 128 + SIGTERM);
  for (int g = 0; g < 2; ++g) CHECK(fs::exists(run.out() / ("stopped." + std::to_string(g))));
  for (auto& e : run.events("worker_exited")) CHECK(e.at("code").as_int64() == 0);
}

TEST_CASE(
    "preemption with --config: the decision carries the checkpoint; SIGTERM -> exit decision") {
  TempDir tmp;
  TrainRun run(tmp.path, 2, config("[0, 1]", "release", "every = 2\n"),
               {"--epochs", "100000", "--epoch-ms", "20"}, {},
               {"--stop-timeout", "50", "--grace-period", "5"});
  preempt_then_stop(run, 2);
}

namespace {

/// The `resize` event of generation `g` (waits for it).
json::object resize_event(TrainRun& run, int64_t g) {
  const auto find = [&]() -> std::optional<json::object> {
    for (auto& e : run.events("resize"))
      if (e.at("generation").as_int64() == g) return e;
    return std::nullopt;
  };
  run.wait_for("the resize event of generation " + std::to_string(g),
               [&] { return find().has_value(); });
  return *find();
}

/// Asserts that the event's critical path and the rank on `gpu` have every phase named.
void check_phases(const json::object& e, const std::vector<std::string>& path, int gpu,
                  const std::string& role, const std::vector<std::string>& marks) {
  INFO("resize event " << json::serialize(e));
  CHECK(e.at("complete").as_bool());
  const json::object& phases = e.at("phases_ms").as_object();
  for (const auto& p : path) {
    CHECK_MESSAGE(phases.contains(p), "phase " << p);
    if (phases.contains(p)) CHECK(phases.at(p).to_number<double>() >= 0);
  }
  double sum = 0;
  for (const auto& [k, v] : phases) sum += v.to_number<double>();
  CHECK(e.at("total_ms").to_number<double>() <= sum + 0.01);  // the path ends at the end
  bool found = false;
  for (const auto& rv : e.at("ranks").as_array()) {
    const json::object& r = rv.as_object();
    if (r.at("gpu").as_int64() != gpu) continue;
    found = true;
    CHECK(r.at("role").as_string() == role);
    double last = -1e18;
    for (const auto& [k, v] : r.at("ms").as_object()) {  // in the order they happened
      CHECK_MESSAGE(v.to_number<double>() >= last, "mark " << std::string_view(k));
      last = v.to_number<double>();
    }
    for (const auto& m : marks) CHECK_MESSAGE(r.at("ms").as_object().contains(m), "mark " << m);
  }
  CHECK_MESSAGE(found, "no record of gpu " << gpu);
}

/// `gpurun status ARGS` of the runs registered under DIR/xdg: (exit status, output).
std::pair<int, std::string> gpurun_status(const fs::path& dir, const std::string& args) {
  const std::string cmd =
      "XDG_RUNTIME_DIR=" + (dir / "xdg").string() + " " + kGpurun + " status " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = ::pclose(p);
  return {WEXITSTATUS(rc), out};
}

}  // namespace

TEST_CASE("every resize's latency breakdown: one resize event per generation, in gpurun status") {
  TempDir tmp;
  // Without standbys: every joiner here is a process spawned for its resize (its `spawned`
  // phase is checked); with them, a released slot's standby would be told to go instead.
  const auto no_standby = [](const std::string& active) {
    return "active_gpus = " + active +
           "\n[park]\nmode = \"release\"\nstandby = false\n[boundary]\ndeadline_s = 60\n";
  };
  TrainRun run(tmp.path, 2, no_standby("[0]"), {"--epoch-ms", "150"});
  run.wait_continues(1);
  const auto edit = [&](const std::string& active) {
    write_file(tmp.path / "config.toml", no_standby(active));
  };
  // grow: the joiner is spawned, starts, takes the state from rank 0
  edit("[0, 1]");
  const json::object grow = resize_event(run, 1);
  CHECK(grow.at("kind").as_string() == "grow");
  CHECK(grow.at("origin").as_string() == "config seen");
  const std::vector<std::string> handoff = {"ready", "comm", "state", "checksum", "resumed"};
  check_phases(grow, {"decision", "spawned", "ready", "comm", "state", "checksum", "resumed"}, 0,
               "source", handoff);
  check_phases(grow, {}, 1, "joiner",
               {"spawned", "seen", "ready", "comm", "state", "checksum", "resumed"});
  run.wait_continues(2);
  // shrink: nothing moves; the leaver's part ends when it leaves
  edit("[0]");
  const json::object shrink = resize_event(run, 2);
  CHECK(shrink.at("kind").as_string() == "shrink");
  check_phases(shrink, {"decision", "comm", "checksum", "resumed", "left"}, 0, "source",
               {"seen", "ready", "comm", "checksum", "resumed"});
  check_phases(shrink, {}, 1, "leaver", {"seen", "ready", "left"});
  run.wait_continues(2);
  // pause: the snapshot round first, then everyone leaves
  edit("[]");
  const json::object pause = resize_event(run, 3);
  CHECK(pause.at("kind").as_string() == "pause");
  check_phases(pause, {"snapshot_decision", "snapshot_end", "decision", "left"}, 0, "leaver",
               {"snapshot_begin", "snapshot_end", "seen", "left"});
  // resume: a new process loads the snapshot
  edit("[0]");
  const json::object resume = resize_event(run, 4);
  CHECK(resume.at("kind").as_string() == "resume");
  check_phases(resume, {"decision", "spawned", "state", "checksum", "resumed"}, 0, "joiner",
               {"spawned", "seen", "ready", "state", "comm", "checksum", "resumed"});
  run.wait_continues(1);
  // gpurun status shows the last one, in status.json and in the text form. status.json is
  // rewritten at most every 100 ms (StatusWriter), so a continue decision that follows the
  // resize event at once may still find the previous file: read until it is there (≤ 5 s).
  int rc = -1;
  std::string text;
  gpurun::testing::poll_until(
      [&] {
        std::tie(rc, text) = gpurun_status(tmp.path, "");
        return text.find("last resize: generation 4 ") != std::string::npos;
      },
      5s, 100ms);
  INFO(text);
  CHECK(rc == 0);
  CHECK(text.find("last resize: generation 4 resume [] -> [0]: ") != std::string::npos);
  CHECK(text.find("  gpu 0 joiner: spawned ") != std::string::npos);
  auto [rcj, js] = gpurun_status(tmp.path, "--json");
  CHECK(rcj == 0);
  const json::value st = json::parse(js);
  CHECK(st.at("last_resize").at("generation").as_int64() == 4);
  CHECK(run.events("resize").size() == 4);  // one per generation, none for the launch
  CHECK(run.finish() == 0);
}

TEST_CASE("the pause snapshot is prepared in the background by default") {
  TempDir tmp;
  TrainRun run(tmp.path, 2, config("[0, 1]"), {"--epoch-ms", "150"});
  run.wait_continues(3);
  INFO(run.full_diag());
  // Every rank prepared (one shared file) on its own thread, before any pause was asked for.
  const auto prepared = run.trace("snapshot_prepared");
  REQUIRE(prepared.size() >= 2);
  int64_t pid = -1;
  for (auto& st : run.trace("start"))
    if (st.at("gpu").as_int64() == 0) pid = st.at("pid").as_int64();
  const fs::path primary = env_of(pid, "GPURUN_SNAPSHOT_PATH");
  for (auto& p : prepared) {
    CHECK(p.at("background").as_bool());
    CHECK(p.at("path").as_string() == primary.string());
    CHECK(p.at("file_bytes").as_int64() > 0);
  }
  CHECK(fs::is_regular_file(primary));
  // The pause writes into it and the resume reads it back.
  write_file(tmp.path / "config.toml", config("[]"));
  run.wait_resize(2);
  write_file(tmp.path / "config.toml", config("[1]"));
  run.wait_resize(3);
  run.wait_continues(1);
  const auto written = run.trace("snapshot_written");
  REQUIRE(written.size() == 1);
  CHECK(written[0].at("path").as_string() == primary.string());
  // The resume's warm joiner mapped the file while it started, so its read only verifies and
  // copies (no mapping inside the resume).
  const auto premapped = run.trace("snapshot_premapped");
  REQUIRE(premapped.size() == 1);
  CHECK(premapped[0].at("path").as_string() == primary.string());
  const auto read = run.trace("snapshot_read");
  REQUIRE(read.size() == 1);
  CHECK(read[0].at("setup_ms").to_number<double>() == 0);
  CHECK(run.check_checksums() >= 2);
  CHECK(run.finish() == 0);
}

TEST_CASE("a memlock limit below the snapshot's size: prepared unlocked, said in one line") {
  TempDir tmp;
  // The workers inherit a soft RLIMIT_MEMLOCK of 4 KiB (the trainer's state is larger).
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_MEMLOCK, &old) == 0);
  struct rlimit low = old;
  low.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_MEMLOCK, &low) == 0);
  std::optional<TrainRun> run;
  run.emplace(tmp.path, 2, config("[0, 1]"), std::vector<std::string>{"--epoch-ms", "150"});
  ::setrlimit(RLIMIT_MEMLOCK, &old);
  run->wait_continues(3);
  INFO(run->full_diag());
  bool unlocked = false;
  for (auto& p : run->trace("snapshot_prepared"))
    if (p.contains("locked")) unlocked = unlocked || !p.at("locked").as_bool();
  CHECK(unlocked);
  const std::string out = slurp(tmp.path / "gpurun.stderr") + slurp(tmp.path / "gpurun.stdout");
  CHECK(out.find("is prepared but not locked in memory: RLIMIT_MEMLOCK (ulimit -l) is 4 KiB") !=
        std::string::npos);
  // A pause still works.
  write_file(tmp.path / "config.toml", config("[]"));
  run->wait_resize(2);
  write_file(tmp.path / "config.toml", config("[0]"));
  run->wait_resize(3);
  run->wait_continues(1);
  CHECK(run->finish() == 0);
}

TEST_CASE("a file-size limit below the snapshot's (ulimit -f): not prepared, pause refused") {
  // Issue 25 item 7: Slurm propagates `ulimit -f`; a snapshot file larger than it ended the
  // worker with SIGXFSZ while it was prepared in the background ("state lost", exit 153).
  TempDir tmp;
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  struct rlimit low = old;
  low.rlim_cur = 512 << 10;  // the state (width 256, depth 2, AdamW) is ~1.6 MB
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &low) == 0);
  std::optional<TrainRun> run;
  run.emplace(tmp.path, 2, config("[0, 1]"),
              std::vector<std::string>{"--epoch-ms", "150", "--width", "256", "--depth", "2"});
  ::setrlimit(RLIMIT_FSIZE, &old);
  run->wait_continues(3);
  write_file(tmp.path / "config.toml", config("[]"));
  run->wait_for("pause_refused", [&] { return !run->events("pause_refused").empty(); });
  run->wait_continues(2);  // both ranks train on
  INFO(run->full_diag());
  const std::string out = slurp(tmp.path / "gpurun.stderr") + slurp(tmp.path / "gpurun.stdout");
  CHECK(out.find("not prepared ahead: RLIMIT_FSIZE (ulimit -f) is 512 KiB") != std::string::npos);
  CHECK(out.find("cannot write the pause snapshot: RLIMIT_FSIZE (ulimit -f) is 512 KiB") !=
        std::string::npos);
  CHECK(run->resizes().size() == 1);  // nobody left, nobody died
  write_file(tmp.path / "config.toml", config("[0, 1]"));
  run->wait_continues(2);
  CHECK(run->finish() == 0);
}

TEST_CASE("a slow-starting joiner warms while the others train and is admitted once ready") {
  TempDir tmp;
  TrainRun run(tmp.path, 3, config("[0, 1]"), {"--epoch-ms", "100", "--startup-ms", "3000"});
  run.wait_continues(1);
  write_file(tmp.path / "config.toml", config("[0, 1, 2]"));
  const auto d = run.wait_resize(2);
  INFO(run.full_diag());
  CHECK(json::serialize(d.at("joiners")) == "[2]");
  CHECK(json::serialize(d.at("active")) == "[0,1,2]");
  const auto ev = run.events();
  const long warming = find_event(ev, "worker_state",
                                  [](const json::object& e) { return slot_to(e, 2, "WARMING"); });
  const long started = find_event(ev, "worker_started", [](const json::object& e) {
    return e.at("local_rank").as_int64() == 2;
  });
  const long ready = find_event(ev, "warm_ready",
                                [](const json::object& e) { return e.at("gpu").as_int64() == 2; });
  const long admitted = find_event(ev, "decision", [](const json::object& e) {
    return json::serialize(e.at("joiners")) == "[2]";
  });
  REQUIRE(warming >= 0);
  REQUIRE(started >= 0);
  REQUIRE(ready >= 0);
  REQUIRE(admitted >= 0);
  // Spawned at the edit, before any decision named it; admitted only after it said ready.
  CHECK(warming < admitted);
  CHECK(started < admitted);
  CHECK(ready < admitted);
  // The two members passed boundaries while it started up: nobody waited for its start-up.
  int continues = 0;
  for (long i = started; i < ready; ++i)
    continues += ev[static_cast<size_t>(i)].at("event").as_string() == "decision" &&
                 ev[static_cast<size_t>(i)].at("kind").as_string() == "continue";
  CHECK(continues >= 2);
  // Only one process ever ran on gpu 2: the warm one was admitted, not respawned.
  CHECK(std::count_if(ev.begin(), ev.end(), [](const json::object& e) {
          return e.at("event").as_string() == "worker_started" &&
                 e.at("local_rank").as_int64() == 2;
        }) == 1);
  run.wait_continues(2);
  CHECK(run.finish() == 0);
  CHECK(run.check_checksums() >= 2);
}

TEST_CASE("warming joiners killed, stalled or cancelled by an edit: the job trains on, same set") {
  TempDir tmp;
  TrainRun run(tmp.path, 4, config("[0, 1]"), {"--epoch-ms", "100", "--startup-ms", "60000"});
  run.wait_continues(1);
  const auto warming = [&](int gpu, const std::string& to) {
    run.wait_for("gpu " + std::to_string(gpu) + " " + to, [&] {
      const auto ev = run.events("worker_state");
      return find_event(ev, "worker_state",
                        [&](const json::object& e) { return slot_to(e, gpu, to); }) >= 0;
    });
  };
  // Killed while it warms: dropped (FAILED), the members never stop.
  write_file(tmp.path / "config.toml", config("[0, 1, 2]"));
  warming(2, "WARMING");
  REQUIRE(::kill(static_cast<pid_t>(latest_started(run, 2)), SIGKILL) == 0);
  warming(2, "FAILED");
  run.wait_continues(3);
  // Stalled (SIGSTOP) while it warms, then removed by an edit: ended, PARKED, not a failure.
  write_file(tmp.path / "config.toml", config("[0, 1, 3]"));
  warming(3, "WARMING");
  const int64_t stalled = latest_started(run, 3);
  REQUIRE(::kill(static_cast<pid_t>(stalled), SIGSTOP) == 0);
  run.wait_continues(3);
  write_file(tmp.path / "config.toml", config("[0, 1]"));
  warming(3, "PARKED");
  run.wait_for("the stalled warm joiner's exit", [&] {
    for (auto& e : run.events("worker_exited"))
      if (e.at("pid").as_int64() == stalled) return true;
    return false;
  });
  run.wait_continues(3);
  INFO(run.full_diag());
  CHECK(run.resizes().size() == 1);  // only the start: the set stayed [0, 1] throughout
  CHECK(run.events("generation_abandoned").empty());
  CHECK(run.finish() == 0);
  for (auto& e : run.events("worker_state"))
    if (e.at("gpu").as_int64() == 3) CHECK(e.at("to").as_string() != "FAILED");
}
