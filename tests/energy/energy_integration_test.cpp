// The supervisor's energy monitor under the real gpurun, against the fake NVML
// (launcher/energy/simulated_nvml/): per-slot energy through CUDA_VISIBLE_DEVICES, windows across a
// shrink and a grow, Zeus' cost, early stop (threshold and history), power limits (fixed,
// restored at exit / SIGTERM / kill -9, no privilege) and the automatic profile with its cache.
// docs/energy.md.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <boost/json.hpp>

#include "elastic_run.hpp"
#include "energy/power_journal.hpp"
#include "energy/simulated_nvml/simulated_nvml_state.hpp"
#include "gpurun_process.hpp"

namespace {

namespace fs = std::filesystem;
namespace json = boost::json;
namespace fake = gpurun::energy::simulated_nvml;
using gpurun::testing::ElasticRun;
using gpurun::testing::TempDir;
using gpurun::testing::write_file;
using namespace std::chrono_literals;

double num(const json::value& v) {
  if (v.is_double()) return v.as_double();
  if (v.is_int64()) return static_cast<double>(v.as_int64());
  if (v.is_uint64()) return static_cast<double>(v.as_uint64());
  FAIL("not a number: " << json::serialize(v));
  return 0;
}

std::vector<int> ints(const json::value& v) {
  std::vector<int> out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<int>(num(x)));
  return out;
}

/// The fake GPUs of a test: a state file plus the environment that points gpurun at it.
struct FakeGpus {
  std::string state;
  explicit FakeGpus(const fs::path& dir, const fake::State& s)
      : state((dir / "nvml_state.txt").string()) {
    fake::write_state(state, s);
  }
  std::map<std::string, std::string> env(std::map<std::string, std::string> extra = {}) const {
    extra.emplace("GPURUN_NVML_LIBRARY", GPURUN_FAKE_NVML);
    extra.emplace("GPURUN_CUDA_LIBRARY", GPURUN_FAKE_NVML);
    extra.emplace("GPURUN_FAKE_NVML_STATE", state);
    // The test's own power journal, not the machine's (/var/lib/gpurun, ~/.local/state).
    extra.emplace("GPURUN_POWER_JOURNAL", journal());
    return extra;
  }
  double limit(unsigned index) const { return fake::current_limit_w(state, index); }
  std::string journal() const { return (fs::path(state).parent_path() / "journal.json").string(); }
};

fake::State gpus_drawing(std::vector<double> watts) {
  fake::State s = fake::h200s(static_cast<unsigned>(watts.size()));
  for (size_t i = 0; i < watts.size(); ++i) s.gpus[i].full_w = watts[i];
  return s;
}

/// `n` GPUs drawing 600 W uncapped, whose power limits range over min_w–600 W (at 600 now).
fake::State gpus_limited(unsigned n, double min_w) {
  fake::State s = gpus_drawing(std::vector<double>(n, 600));
  for (auto& g : s.gpus) {
    g.min_w = min_w;
    g.max_w = 600;
    g.default_w = 600;
    g.limit_w = 600;
  }
  return s;
}

json::object read_json(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str()).as_object();
}

/// Zeus' cost by hand: η·E + (1−η)·MaxPower·T.
double zeus(double e, double t, double max_power, double eta) {
  return eta * e + (1 - eta) * max_power * t;
}

void wait_until(const std::string& what, const std::function<bool()>& pred,
                std::chrono::milliseconds limit = 30s) {
  if (!gpurun::testing::poll_until(pred, limit)) FAIL("timed out waiting for " << what);
}

}  // namespace

TEST_CASE(
    "plain run: each slot's energy is its own GPU's, through CUDA_VISIBLE_DEVICES and "
    "CUDA's order, by UUID") {
  TempDir dir("gpurun-energy");
  // NVML 0, 1, 2 draw 100, 200, 300 W. CUDA enumerates them as NVML 2, 0, 1 (not NVML's order),
  // so CUDA_VISIBLE_DEVICES=1,0 means slot 0 = NVML 0 (100 W), slot 1 = NVML 2 (300 W).
  fake::State s = gpus_drawing({100, 200, 300});
  s.cuda_order = {2, 0, 1};
  FakeGpus gpus(dir.path, s);
  ElasticRun run(GPURUN_BINARY, dir.path, 2, std::nullopt, {"/bin/sleep", "2"},
                 {"--energy", "on", "--energy-summary", (dir.path / "summary.json").string()},
                 "cpu", gpus.env({{"CUDA_VISIBLE_DEVICES", "1,0"}}));
  REQUIRE(run.wait(30s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  const auto monitor = run.events("energy_monitor");
  REQUIRE(monitor.size() == 1);
  const auto& mg = monitor[0].at("gpus").as_array();
  REQUIRE(mg.size() == 2);
  CHECK(mg[0].as_object().at("uuid").as_string() == fake::test_uuid(0));
  CHECK(mg[1].as_object().at("uuid").as_string() == fake::test_uuid(2));
  const json::object sum = read_json(dir.path / "summary.json").at("summary").as_object();
  const double t = num(sum.at("seconds"));
  CHECK(t > 1.9);
  const auto& per = sum.at("gpu_energy_j").as_object();
  // Within one 100 ms counter step (and the edges) of P·T.
  CHECK(num(per.at("0")) == doctest::Approx(100 * t).epsilon(0.08));
  CHECK(num(per.at("1")) == doctest::Approx(300 * t).epsilon(0.08));
  // Cost by hand: η = 0.5, MaxPower = 2 × 700 W.
  CHECK(num(sum.at("cost")) ==
        doctest::Approx(zeus(num(sum.at("energy_j")), t, 1400, 0.5)).epsilon(1e-6));
  // "time" windows only: a plain run has no boundaries.
  for (const auto& w : run.events("energy")) CHECK(w.at("kind").as_string() == "time");

  SUBCASE("UUIDs and a UUID prefix in CUDA_VISIBLE_DEVICES") {
    TempDir d2("gpurun-energy");
    FakeGpus g2(d2.path, s);
    const std::string cvd = fake::test_uuid(1) + "," + fake::test_uuid(2).substr(0, 12);
    ElasticRun r2(GPURUN_BINARY, d2.path, 2, std::nullopt, {"/bin/sleep", "1"},
                  {"--energy", "on", "--energy-summary", (d2.path / "summary.json").string()},
                  "cpu", g2.env({{"CUDA_VISIBLE_DEVICES", cvd}}));
    REQUIRE(r2.wait(30s));
    REQUIRE_MESSAGE(r2.code() == 0, r2.diag());
    const json::object s2 = read_json(d2.path / "summary.json").at("summary").as_object();
    const double t2 = num(s2.at("seconds"));
    CHECK(num(s2.at("gpu_energy_j").as_object().at("0")) == doctest::Approx(200 * t2).epsilon(0.1));
    CHECK(num(s2.at("gpu_energy_j").as_object().at("1")) == doctest::Approx(300 * t2).epsilon(0.1));
  }
}

TEST_CASE("no NVML: one clear line, monitoring off, the job goes on") {
  TempDir dir("gpurun-energy");
  ElasticRun run(GPURUN_BINARY, dir.path, 1, std::nullopt, {"/bin/true"}, {"--energy", "on"}, "cpu",
                 {{"GPURUN_NVML_LIBRARY", (dir.path / "no-such-libnvidia-ml.so").string()}});
  REQUIRE(run.wait(30s));
  CHECK(run.code() == 0);
  const std::string err = gpurun::testing::slurp(dir.path / "gpurun.stderr");
  CHECK(err.find("gpurun: energy: monitoring off:") != std::string::npos);
  CHECK(err.find("no-such-libnvidia-ml.so") != std::string::npos);
  CHECK(run.events("energy_monitor").empty());
}

TEST_CASE(
    "elastic: epoch windows across a shrink and a grow; a parked GPU is not charged and "
    "MaxPower follows the active set") {
  TempDir d2("gpurun-energy");
  FakeGpus g2(d2.path, gpus_drawing({300, 200}));
  ElasticRun r2(GPURUN_BINARY, d2.path, 2, std::string("active_gpus = [0, 1]\n"),
                {GPURUN_FAKE_WORKER, d2.str(), "400"},
                {"--energy", "on", "--energy-summary", (d2.path / "summary.json").string()}, "cpu",
                g2.env());
  r2.wait_continues(1);
  {
    // `gpurun status` while it trains: power and the epoch's energy per GPU, the cost so far.
    // status.json is refreshed every second: within 1.2 s it counts the epoch just ended.
    const std::map<std::string, std::string> xdg{{"XDG_RUNTIME_DIR", (d2.path / "xdg").string()}};
    json::object st;
    const auto refreshed = [&] {
      gpurun::testing::ChildProcess js({GPURUN_BINARY, "status", "--json"}, xdg,
                                       d2.path / "status.json.out", d2.path / "status.json.err");
      REQUIRE(js.wait(20s));
      boost::system::error_code ec;
      const json::value v = json::parse(js.stdout_text(), ec);
      if (ec || !v.is_object()) return false;
      const json::value* energy = v.as_object().if_contains("energy");
      if (!energy || !energy->is_object() || !energy->as_object().contains("epochs")) return false;
      st = v.as_object();
      return num(energy->as_object().at("epochs")) >= 1;
    };
    gpurun::testing::poll_until(refreshed, 1200ms, 100ms);
    gpurun::testing::ChildProcess status({GPURUN_BINARY, "status"}, xdg, d2.path / "status.out",
                                         d2.path / "status.err");
    REQUIRE(status.wait(20s));
    const std::string text = status.stdout_text();
    CHECK_MESSAGE(text.find("POWER(W)") != std::string::npos, text << status.stderr_text());
    CHECK(text.find("EPOCH E(J)") != std::string::npos);
    CHECK(text.find("300.0") != std::string::npos);  // slot 0's draw
    CHECK(text.find("200.0") != std::string::npos);  // slot 1's draw
    CHECK(text.find("energy: ") != std::string::npos);
    CHECK(text.find("Zeus cost so far") != std::string::npos);
    CHECK(text.find("early-stop threshold none") != std::string::npos);  // none configured
    REQUIRE(st.contains("slots"));
    const auto& slots = st.at("slots").as_array();
    REQUIRE(slots.size() == 2);
    CHECK(num(slots[0].as_object().at("power_w")) == doctest::Approx(300));
    CHECK(num(slots[1].as_object().at("power_w")) == doctest::Approx(200));
    CHECK(num(slots[0].as_object().at("epoch_energy_j")) > 0);
    CHECK(num(st.at("energy").as_object().at("epochs")) >= 1);
  }
  write_file(d2.path / "config.toml", "active_gpus = [0]\n");
  r2.wait_resize(2);
  r2.wait_continues(2);
  write_file(d2.path / "config.toml", "active_gpus = [0, 1]\n");
  r2.wait_resize(3);
  r2.wait_continues(1);
  { std::ofstream(d2.path / "stop") << 7; }
  REQUIRE(r2.wait(60s));
  REQUIRE_MESSAGE(r2.code() == 0, r2.diag());

  bool saw_one = false, saw_two = false;
  for (const auto& w : r2.events("energy")) {
    const std::vector<int> active = ints(w.at("active"));
    const double e = num(w.at("energy_j")), t = num(w.at("seconds"));
    const double max_power = num(w.at("max_power_w"));
    // MaxPower = Σ of the active GPUs' maximum limits (700 W each).
    CHECK(max_power == doctest::Approx(700.0 * static_cast<double>(active.size())));
    // The event's cost is Zeus' formula of its own energy and time.
    CHECK(num(w.at("cost")) == doctest::Approx(zeus(e, t, max_power, 0.5)).epsilon(1e-9));
    const auto& g = w.at("gpus").as_array();
    REQUIRE(g.size() == active.size());
    double sum = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const auto& o = g[i].as_object();
      const int slot = static_cast<int>(num(o.at("slot")));
      CHECK(slot == active[i]);
      const double watts = slot == 0 ? 300 : 200;
      // Each GPU's energy is its draw over the window, to within one counter step per edge.
      // (≤ 0.3 s of draw: the 100 ms counter step at each edge, plus a late sample on a busy
      // machine.)
      CHECK(std::abs(num(o.at("energy_j")) - watts * t) <= watts * 0.3 + 0.02 * watts * t);
      sum += num(o.at("energy_j"));
    }
    CHECK(e == doctest::Approx(sum));
    if (w.at("kind").as_string() == "epoch" && t > 0.2) {
      saw_one = saw_one || active == std::vector<int>{0};
      saw_two = saw_two || active == std::vector<int>{0, 1};
    }
  }
  CHECK(saw_one);
  CHECK(saw_two);
  // One energy_epoch per epoch trained, 0..E: fake_worker trains epoch E ≥ 7, then stops on
  // reaching the stop epoch without reporting its boundary (the exit ends epoch E).
  const auto epochs = r2.events("energy_epoch");
  const auto reports = r2.events("decision");
  REQUIRE(epochs.size() >= 8);
  // Every boundary decided (all but the start) ended one epoch; the exit ended the last.
  CHECK(epochs.size() == reports.size());
  double total = 0;
  for (size_t i = 0; i < epochs.size(); ++i) {
    CHECK(num(epochs[i].at("epoch")) == static_cast<double>(i));
    total += num(epochs[i].at("cost"));
    CHECK(num(epochs[i].at("cost_total")) == doctest::Approx(total));
  }
  // While slot 1 was parked it drew 200 W but was charged nothing: its energy is less than
  // 200 W over the whole run.
  const json::object sum = read_json(d2.path / "summary.json").at("summary").as_object();
  const double run_s = num(sum.at("seconds"));
  CHECK(num(sum.at("gpu_energy_j").as_object().at("1")) < 200 * run_s - 200 * 0.6);
  CHECK(num(sum.at("gpu_energy_j").as_object().at("0")) ==
        doctest::Approx(300 * run_s).epsilon(0.1));
}

TEST_CASE("elastic: a paused job is not charged; the pause is a window of its own") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({400}));
  ElasticRun run(GPURUN_BINARY, dir.path, 1, std::string("active_gpus = [0]\n"),
                 {GPURUN_FAKE_WORKER, dir.str(), "200"},
                 {"--energy", "on", "--energy-summary", (dir.path / "summary.json").string()},
                 "cpu", gpus.env());
  run.wait_continues(1);
  write_file(dir.path / "config.toml", "active_gpus = []\n");
  run.wait_resize(2);
  std::this_thread::sleep_for(1500ms);  // paused: the GPU still draws 400 W, not ours
  write_file(dir.path / "config.toml", "active_gpus = [0]\n");
  run.wait_resize(3);
  run.wait_continues(1);
  std::ofstream(dir.path / "stop") << 0;  // the next epoch start ends it
  REQUIRE(run.wait(60s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  double paused_s = 0;
  for (const auto& w : run.events("energy")) {
    if (!w.at("active").as_array().empty()) continue;
    CHECK(w.at("kind").as_string() == "pause");
    CHECK(num(w.at("energy_j")) == 0);
    CHECK(num(w.at("cost")) == 0);
    CHECK(num(w.at("max_power_w")) == 0);
    paused_s += num(w.at("seconds"));
  }
  CHECK(paused_s > 1.4);
  const json::object sum = read_json(dir.path / "summary.json").at("summary").as_object();
  const double run_s = num(sum.at("seconds"));
  // The summary charges exactly what the windows charged (the pause windows nothing) ...
  double windows_j = 0;
  for (const auto& w : run.events("energy")) windows_j += num(w.at("energy_j"));
  CHECK(num(sum.at("gpu_energy_j").as_object().at("0")) == doctest::Approx(windows_j));
  // ... which is the run's time minus the pause at 400 W. The tolerance absorbs a loaded
  // machine's late samples at the pause's edges (up to ~16% seen in CI); charging the ≥ 1.4 s
  // pause would add ≥ 560 J to ~500 J.
  CHECK(num(sum.at("gpu_energy_j").as_object().at("0")) ==
        doctest::Approx(400 * (run_s - paused_s)).epsilon(0.3));
}

TEST_CASE(
    "early stop from the history: the second run of a job stops at β × the first run's "
    "cost, with the documented status") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({300}));
  const std::string cfg =
      "[energy]\nhistory = \"history.jsonl\"\njob = \"test-job\"\ncost_threshold_factor = 1.0\n";
  {
    std::ofstream(dir.path / "stop") << 3;
    ElasticRun first(GPURUN_BINARY, dir.path, 1, cfg, {GPURUN_FAKE_WORKER, dir.str(), "300"},
                     {"--energy", "on"}, "cpu", gpus.env());
    REQUIRE(first.wait(60s));
    REQUIRE_MESSAGE(first.code() == 0, first.diag());
    CHECK(first.events("early_stop").empty());
  }
  std::string history = gpurun::testing::slurp(dir.path / "history.jsonl");
  REQUIRE(std::count(history.begin(), history.end(), '\n') == 1);
  const json::object h1 = json::parse(history).as_object();
  CHECK(h1.at("completed").as_bool());
  CHECK(h1.at("job").as_string() == "test-job");
  const double best = num(h1.at("cost"));
  REQUIRE(best > 0);

  std::ofstream(dir.path / "stop") << 30;  // would train 30 epochs
  fs::remove(dir.path / "events.jsonl");   // the event log appends: read only this run's
  ElasticRun second(GPURUN_BINARY, dir.path, 1, cfg, {GPURUN_FAKE_WORKER, dir.str(), "300"},
                    {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(second.wait(60s));
  CHECK_MESSAGE(second.code() == 3, second.diag());
  const auto stops = second.events("early_stop");
  REQUIRE(stops.size() == 1);
  const int64_t stop_epoch = static_cast<int64_t>(num(stops[0].at("epoch")));
  CHECK(stop_epoch < 29);
  CHECK(num(stops[0].at("threshold")) == doctest::Approx(best));
  // The rule: stop at the first epoch whose cost so far + the predicted next epoch passes it.
  for (const auto& e : second.events("energy_epoch")) {
    const double predicted_total = num(e.at("cost_total")) + num(e.at("predicted_next_cost"));
    if (static_cast<int64_t>(num(e.at("epoch"))) < stop_epoch)
      CHECK(predicted_total <= best);
    else if (static_cast<int64_t>(num(e.at("epoch"))) == stop_epoch)
      CHECK(predicted_total > best);
  }
  const std::string err = gpurun::testing::slurp(dir.path / "gpurun.stderr");
  CHECK(err.find("stopped early by its cost threshold (exit status 3)") != std::string::npos);
  // The event log says 3 as well.
  const auto shutdown = second.events("shutdown");
  REQUIRE(shutdown.size() == 1);
  CHECK(num(shutdown[0].at("exit_code")) == 3);
  CHECK(num(second.events("energy_summary").at(0).at("exit_code")) == 3);
  history = gpurun::testing::slurp(dir.path / "history.jsonl");
  REQUIRE(std::count(history.begin(), history.end(), '\n') == 2);
  const json::object h2 = json::parse(history.substr(history.find('\n') + 1)).as_object();
  CHECK_FALSE(h2.at("completed").as_bool());  // an early-stopped run never becomes the best
}

TEST_CASE(
    "early stop: the workers' start-up is a window of its own, not epoch 0's, so a job "
    "whose whole run stays below the threshold is not stopped at its first boundary") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({300}));
  // 2.8 s of start-up, then 6 epochs of 5 steps of 20 ms (the steps go to the progress file,
  // as the runtime publishes them). Zeus' cost runs at 0.5·300 + 0.5·700 = 500 J/s.
  std::ofstream(dir.path / "startup_ms") << 2800;
  std::ofstream(dir.path / "steps") << 5;
  std::ofstream(dir.path / "stop") << 5;
  // The whole run (start-up ~3 s + 6 × 0.1 s) costs about 1800 J, below 2500 J; a prediction
  // from an epoch 0 that held the start-up (2 × > 2.9 s × 500 J/s > 2900 J) passes it.
  ElasticRun run(GPURUN_BINARY, dir.path, 1, std::string("[energy]\ncost_threshold = 2500\n"),
                 {GPURUN_FAKE_WORKER, dir.str(), "100"},
                 {"--energy", "on", "--energy-summary", (dir.path / "summary.json").string()},
                 "cpu", gpus.env());
  REQUIRE(run.wait(60s));
  const json::object sum = read_json(dir.path / "summary.json").at("summary").as_object();
  REQUIRE_MESSAGE(num(sum.at("cost")) < 2500, run.diag());  // the premise: the run fits
  CHECK_MESSAGE(run.code() == 0, run.diag());
  CHECK(run.events("early_stop").empty());
  // The start-up window ends at the first step; epoch 0 is an epoch like the others.
  std::vector<json::object> startup;
  for (const auto& w : run.events("energy"))
    if (w.at("kind").as_string() == "startup") startup.push_back(w);
  REQUIRE_MESSAGE(startup.size() == 1, run.diag());
  CHECK(num(startup[0].at("seconds")) >= 2.8);
  const auto epochs = run.events("energy_epoch");
  REQUIRE(epochs.size() == 6);
  CHECK(num(epochs[0].at("seconds")) < 0.5);
  // The start-up counts in the cost so far (it was spent) and in the totals.
  CHECK(num(epochs[0].at("cost_total")) ==
        doctest::Approx(num(startup[0].at("cost")) + num(epochs[0].at("cost"))));
  CHECK(num(sum.at("seconds")) >= 2.8 + num(epochs[0].at("seconds")));
}

#ifdef GPURUN_ENERGY_WORKER
TEST_CASE(
    "early stop with the worker runtime: every worker leaves epochs() normally and runs "
    "its code after the loop") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({300, 300}));
  // Per epoch ≈ 0.5·600·T + 0.5·1400·T = 1000·T J, T ≈ 0.5 s: the threshold is passed after a
  // few epochs, long before 60.
  ElasticRun run(
      GPURUN_BINARY, dir.path, 2, std::string("[energy]\ncost_threshold = 4000\n"),
      {GPURUN_ENERGY_WORKER, dir.str(), "--epochs", "60", "--steps", "10", "--step-ms", "100"},
      {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(run.wait(120s));
  CHECK_MESSAGE(run.code() == 3, run.diag());
  const auto stops = run.events("early_stop");
  REQUIRE(stops.size() == 1);
  const int64_t e = static_cast<int64_t>(num(stops[0].at("epoch")));
  CHECK(e < 59);
  // Both ranks ran their post-loop code after e + 1 epochs.
  for (int slot : {0, 1}) {
    std::ifstream in(dir.path / ("after_loop." + std::to_string(slot)));
    int64_t done = -1;
    REQUIRE_MESSAGE(static_cast<bool>(in >> done), "slot " << slot << "\n" << run.diag());
    CHECK(done == e + 1);
  }
  const auto decisions = run.events("decision");
  REQUIRE(!decisions.empty());
  CHECK(decisions.back().at("kind").as_string() == "exit");
}

TEST_CASE(
    "power_limit_watts = \"auto\": the profile chooses what a hand calculation on its "
    "measurements chooses, caches it, and the next run skips profiling") {
  TempDir dir("gpurun-energy");
  // One GPU whose limits range over 450–600 W: 7 limits in 25 W steps. Uncapped it draws
  // 600 W; under a limit L it draws L and runs (L/600)^0.9 as fast.
  fake::State s = gpus_limited(1, 450);
  s.gpus[0].speed_exp = 0.9;
  FakeGpus gpus(dir.path, s);
  const std::string cfg =
      "[energy]\npower_limit_watts = \"auto\"\nprofile_warmup_steps = 2\n"
      "profile_measure_steps = 10\nprofile_cache = \"power-cache.json\"\njob = \"auto-test\"\n";
  const std::vector<std::string> worker = {
      GPURUN_ENERGY_WORKER, dir.str(), "--epochs", "8", "--steps", "20", "--step-ms", "60"};
  unsigned chosen = 0;
  {
    ElasticRun run(GPURUN_BINARY, dir.path, 1, cfg, worker, {"--energy", "on"}, "cpu", gpus.env());
    REQUIRE(run.wait(120s));
    REQUIRE_MESSAGE(run.code() == 0, run.diag());
    const auto rows = run.events("power_profile");
    REQUIRE_MESSAGE(rows.size() == 7, run.diag());
    double best_cost = 1e300;
    unsigned best_limit = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      const unsigned limit = static_cast<unsigned>(num(r.at("limit_w")));
      CHECK(limit == 600 - 25 * i);
      const double steps = num(r.at("steps")), sec = num(r.at("seconds"));
      const double energy = num(r.at("energy_j"));
      CHECK(steps >= 10);
      CHECK(r.at("cooldown").as_string() == "no temperature");  // this fake GPU has no sensor
      // The measurement sees the simulated GPU: it draws its limit.
      CHECK(energy / sec == doctest::Approx(static_cast<double>(limit)).epsilon(0.15));
      // Cost per step by hand: η·E/steps + (1−η)·MaxPower·T/steps, MaxPower = 600 W.
      const double cost = 0.5 * energy / steps + 0.5 * 600 * sec / steps;
      CHECK(num(r.at("cost_per_step")) == doctest::Approx(cost).epsilon(1e-6));
      if (cost < best_cost) {
        best_cost = cost;
        best_limit = limit;
      }
    }
    const auto limits = run.events("power_limit");
    REQUIRE(!limits.empty());
    bool found = false;
    for (const auto& l : limits)
      if (l.at("source").as_string() == "profile") {
        chosen = static_cast<unsigned>(num(l.at("limit_w")));
        found = true;
      }
    REQUIRE_MESSAGE(found, run.diag());
    CHECK(chosen == best_limit);
    // Restored at exit.
    CHECK(gpus.limit(0) == doctest::Approx(600));
    // The start line does not promise a cool-down no sensor can time.
    const std::string err = gpurun::testing::slurp(dir.path / "gpurun.stderr");
    CHECK(err.find("no GPU here reports its temperature, so a measurement starts without a "
                   "cool-down") != std::string::npos);
    CHECK(err.find("temperature stayed within") == std::string::npos);
  }
  fs::remove(dir.path / "events.jsonl");  // the event log appends: read only this run's
  ElasticRun again(GPURUN_BINARY, dir.path, 1, cfg, worker, {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(again.wait(120s));
  REQUIRE_MESSAGE(again.code() == 0, again.diag());
  CHECK_MESSAGE(again.events("power_profile").empty(), again.diag());
  const auto limits = again.events("power_limit");
  REQUIRE(!limits.empty());
  CHECK(limits.front().at("source").as_string() == "cache");
  CHECK(static_cast<unsigned>(num(limits.front().at("limit_w"))) == chosen);
  CHECK(gpurun::testing::slurp(dir.path / "gpurun.stderr").find("from the cache") !=
        std::string::npos);
}

TEST_CASE(
    "power-limit profile with a cool-down: each limit is measured once the fake GPU's "
    "temperature has settled at that limit's own value") {
  TempDir dir("gpurun-energy");
  // One GPU, limits 550–600 W (3 limits). Its temperature follows the draw with τ = 1 s at
  // 0.4 °C/W (ambient −150 °C puts 600, 575 and 550 W at 90, 80 and 70 °C): each step down
  // sheds 10 °C, which takes ~3 s to settle within 1 °C over 1 s; the 2 warm-up steps alone
  // take 0.12 s, when the GPU is still ~9 °C above the new limit's value.
  fake::State s = gpus_limited(1, 550);
  s.gpus[0].temp = fake::Gpu::Thermal{-150, 0.4, 1.0};
  FakeGpus gpus(dir.path, s);
  const auto steady_c = [](double limit_w) { return -150 + 0.4 * limit_w; };
  const std::string cfg =
      "[energy]\npower_limit_watts = \"auto\"\nprofile_warmup_steps = 2\n"
      "profile_measure_steps = 5\nprofile_settle_s = 1\nprofile_cooldown_s = 20\n";
  const std::vector<std::string> worker = {
      GPURUN_ENERGY_WORKER, dir.str(), "--epochs", "4", "--steps", "60", "--step-ms", "60"};
  ElasticRun run(GPURUN_BINARY, dir.path, 1, cfg, worker, {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(run.wait(120s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  const auto rows = run.events("power_profile");
  REQUIRE_MESSAGE(rows.size() == 3, run.diag());
  for (const auto& r : rows) {
    const double limit = num(r.at("limit_w"));
    CAPTURE(limit);
    CHECK(r.at("cooldown").as_string() == "settled");
    CHECK(num(r.at("warmup_s")) >= 1.0);
    // NVML's whole degrees at the measurement's start: the limit's own steady value, not the
    // previous limit's heat (10 °C above it).
    REQUIRE(r.at("temp_c").is_number());
    CHECK(std::abs(num(r.at("temp_c")) - steady_c(limit)) <= 1.5);
  }
  CHECK(num(rows[1].at("warmup_s")) >= 2.0);  // 600 → 575 W: ~3 s to shed 10 °C
  CHECK(gpurun::testing::slurp(dir.path / "gpurun.stderr").find("temperature stayed within") !=
        std::string::npos);
}

TEST_CASE("power_limit_watts = \"auto\": a job that ends mid-profile says so and caches nothing") {
  TempDir dir("gpurun-energy");
  fake::State s = gpus_limited(1, 450);
  FakeGpus gpus(dir.path, s);
  const std::string cfg =
      "[energy]\npower_limit_watts = \"auto\"\nprofile_warmup_steps = 2\n"
      "profile_measure_steps = 10\nprofile_cache = \"power-cache.json\"\n";
  // 12 steps in all: the first limit is measured, the second not.
  ElasticRun run(
      GPURUN_BINARY, dir.path, 1, cfg,
      {GPURUN_ENERGY_WORKER, dir.str(), "--epochs", "1", "--steps", "16", "--step-ms", "40"},
      {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(run.wait(60s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  CHECK(run.events("power_profile").size() == 1);
  CHECK(gpurun::testing::slurp(dir.path / "gpurun.stderr")
            .find("the power-limit profile did not finish: the job ended after 1 of 7 limits "
                  "measured; nothing is cached") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path / "power-cache.json"));
  CHECK(gpus.limit(0) == doctest::Approx(600));  // restored
}

TEST_CASE(
    "scale = \"auto\": on fake GPUs whose speed-up stops at 2, allowed_gpus [0, 1, 2] of 4 and "
    "min_gpus = 2, the search measures 3 and 2 GPUs, chooses the count of least cost by the "
    "fake's formulas and gives the rest back") {
  TempDir dir("gpurun-energy");
  // 4 GPUs drawing 600 W each (max limit 700 W); an epoch is 24 samples of 40 ms on one GPU,
  // and lasts at least 480 ms: T(n) = max(0.48, 0.96 / n) s, E(n) = n · 600 W · T(n).
  // GPU 3 is not allowed: given back from the start (before: never, and the search, waiting
  // for epochs on the allowed GPUs alone, never measured). min_gpus = 2: the descent ends at
  // 2 (before: it went on to 1, where the policy kept 2 GPUs, and never ended).
  FakeGpus gpus(dir.path, gpus_drawing({600, 600, 600, 600}));
  const double work_s = 24 * 0.040, floor_s = 0.480, draw_w = 600, eta = 0.5,
               max_power_w = 3 * 700.0;
  const auto model_cost = [&](int n) {
    const double t = std::max(floor_s, work_s / n);
    return zeus(n * draw_w * t, t, max_power_w, eta);
  };
  REQUIRE(model_cost(2) < 0.9 * model_cost(3));  // 792 and 936 J
  const std::string cfg =
      "[energy]\nscale = \"auto\"\nallowed_gpus = [0, 1, 2]\n[policy]\nmin_gpus = 2\n";
  const std::vector<std::string> worker = {
      GPURUN_ENERGY_WORKER, dir.str(), "--epochs",         "12", "--steps", "24",
      "--step-ms",          "40",      "--epoch-floor-ms", "480"};
  ElasticRun run(GPURUN_BINARY, dir.path, 4, cfg, worker, {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(run.wait(180s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  const auto rows = run.events("scale_profile");
  REQUIRE_MESSAGE(rows.size() == 2, run.diag());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const int n = static_cast<int>(num(r.at("gpus")));
    CAPTURE(n);
    CHECK(n == 3 - static_cast<int>(i));  // from every allowed GPU down to min_gpus
    const double sec = num(r.at("seconds")), energy = num(r.at("energy_j"));
    // The measurement is the fake's: n GPUs drawing 600 W each.
    CHECK(energy / sec == doctest::Approx(n * draw_w).epsilon(0.15));
    CHECK(num(r.at("cost")) == doctest::Approx(zeus(energy, sec, max_power_w, eta)));
  }
  CHECK(num(rows[1].at("cost")) < num(rows[0].at("cost")));
  const auto choice = run.events("scale_choice");
  REQUIRE_MESSAGE(choice.size() == 1, run.diag());
  CHECK(num(choice[0].at("gpus")) == 2);
  CHECK(ints(choice[0].at("active")) == std::vector<int>{0, 1});
  CHECK(ints(choice[0].at("given_back")) == std::vector<int>{2});
  // The job went on with the choice: GPU 3 was given back first (3 measured on [0, 1, 2]),
  // the last resize trains on [0, 1], as do the last epochs.
  const auto resizes = run.resizes();
  REQUIRE(resizes.size() >= 2);
  CHECK(std::any_of(resizes.begin(), resizes.end(), [](const auto& r) {
    return ints(r.at("active")) == std::vector<int>{0, 1, 2};
  }));
  CHECK(ints(resizes.back().at("active")) == std::vector<int>{0, 1});
  const auto epochs = run.events("energy_epoch");
  REQUIRE(epochs.size() >= 2);
  CHECK(num(epochs.back().at("active_gpus")) == doctest::Approx(2));
  const std::string err = gpurun::testing::slurp(dir.path / "gpurun.stderr");
  CHECK(err.find("scale: chose 2 of 3 GPUs") != std::string::npos);
  CHECK(err.find("(not below 2: [policy] min_gpus)") != std::string::npos);
  CHECK(err.find("GPUs [3] are not in [energy] allowed_gpus: given back") != std::string::npos);
}
TEST_CASE("scale = \"auto\": a job that ends mid-search says what it measured, no choice") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({600, 600, 600}));
  // 3 epochs: 3 GPUs are measured (warm-up, measured), 2 only warmed up when the job ends.
  ElasticRun run(
      GPURUN_BINARY, dir.path, 3, std::string("[energy]\nscale = \"auto\"\n"),
      {GPURUN_ENERGY_WORKER, dir.str(), "--epochs", "3", "--steps", "6", "--step-ms", "40"},
      {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(run.wait(60s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  CHECK(run.events("scale_choice").empty());
  const std::string err = gpurun::testing::slurp(dir.path / "gpurun.stderr");
  CHECK_MESSAGE(err.find("scale: the job ended while measuring 2 of 3 GPUs") != std::string::npos,
                err);
  CHECK(err.find("no GPU count was chosen (cost per epoch measured: 3 GPUs ") != std::string::npos);
}

TEST_CASE(
    "scale and power_limit_watts both \"auto\": the GPU-count search measures only epochs "
    "after the power-limit profile ended") {
  // Before: both ran at once, so the counts were measured under limits still changing.
  TempDir dir("gpurun-energy");
  fake::State s = gpus_limited(2, 550);  // three limits: 600, 575, 550 W
  FakeGpus gpus(dir.path, s);
  const std::string cfg =
      "[energy]\nscale = \"auto\"\npower_limit_watts = \"auto\"\nprofile_warmup_steps = 2\n"
      "profile_measure_steps = 5\nprofile_cooldown_s = 0\n";
  const std::vector<std::string> worker = {
      GPURUN_ENERGY_WORKER, dir.str(), "--epochs", "12", "--steps", "12", "--step-ms", "40"};
  ElasticRun run(GPURUN_BINARY, dir.path, 2, cfg, worker, {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(run.wait(180s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  // The event log in order: the profile's choice comes before the first scale row, and every
  // row's epochs began after the epoch the profile ended in.
  int64_t profile_end_epoch = -1;
  bool chosen = false, row_seen = false;
  for (const auto& e : run.events()) {
    const std::string name = e.at("event").as_string().c_str();
    if (name == "energy_epoch" && !chosen)
      profile_end_epoch = static_cast<int64_t>(num(e.at("epoch")));
    if (name == "power_limit" && e.at("source").as_string() == "profile") {
      chosen = true;
      CHECK_FALSE(row_seen);
    }
    if (name == "scale_profile") {
      row_seen = true;
      REQUIRE(chosen);
      const auto last = static_cast<int64_t>(num(e.at("last_epoch")));
      const auto epochs = static_cast<int64_t>(num(e.at("epochs")));
      CHECK(last - epochs + 1 > profile_end_epoch + 1);
    }
  }
  CHECK_MESSAGE(chosen, run.diag());
  CHECK_MESSAGE(row_seen, run.diag());
  CHECK(run.events("scale_choice").size() == 1);
  CHECK(gpurun::testing::slurp(dir.path / "gpurun.stderr")
            .find("ran while the power-limit profile measures: the GPU-count search starts after "
                  "it") != std::string::npos);
}
#endif

TEST_CASE(
    "the power journal: limits and locked clocks left by a kill -9 of gpurun and its guard are "
    "restored at the next start; a running job's are left alone") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({600, 600}));
  fs::create_directories(dir.path / "a");
  fs::create_directories(dir.path / "b");
  fs::create_directories(dir.path / "c");
  const std::string cfg = "[energy]\npower_limit_watts = 400\nlocked_clocks_mhz = [1200, 1500]\n";
  ElasticRun a(GPURUN_BINARY, dir.path / "a", 2, cfg,
               {GPURUN_FAKE_WORKER, (dir.path / "a").string(), "200"}, {"--energy", "on"}, "cpu",
               gpus.env());
  const auto changed = [&] {
    return gpus.limit(0) == 400 && gpus.limit(1) == 400 &&
           fake::current_clocks(gpus.state, 0) == "1200:1500" &&
           fake::current_clocks(gpus.state, 1) == "1200:1500";
  };
  wait_until("the limits and clocks to be set", changed);
  auto journal = gpurun::energy::read_journal(gpus.journal());
  REQUIRE(journal.size() == 2);
  for (const auto& e : journal) {
    CHECK(e.original_mw == 700000);
    CHECK(e.clocks_locked);
    CHECK(e.host == gpurun::energy::host_name());
  }
  const pid_t guard = static_cast<pid_t>(journal[0].guard_pid);
  REQUIRE(guard > 1);
  REQUIRE(
      gpurun::testing::slurp("/proc/" + std::to_string(guard) + "/cmdline").find("__power-guard") !=
      std::string::npos);  // ours: the guard of run a

  // Another job starting now must not take a's changes for leftovers: a's guard is alive.
  {
    std::ofstream(dir.path / "c" / "stop") << 1;
    ElasticRun c(GPURUN_BINARY, dir.path / "c", 2, "[energy]\n",
                 {GPURUN_FAKE_WORKER, (dir.path / "c").string(), "100"}, {"--energy", "on"}, "cpu",
                 gpus.env());
    REQUIRE(c.wait(60s));
    CHECK_MESSAGE(c.code() == 0, c.diag());
    CHECK(changed());
    CHECK(gpurun::energy::read_journal(gpus.journal()).size() == 2);
  }

  // Both die at once: the guard is stopped (it cannot restore on the pipe's EOF), gpurun and
  // then the guard are killed.
  REQUIRE(::kill(guard, SIGSTOP) == 0);
  ::kill(a.proc.pid, SIGKILL);
  REQUIRE(a.wait(30s));
  REQUIRE(::kill(guard, SIGKILL) == 0);
  ::kill(guard, SIGCONT);
  const std::string proc = "/proc/" + std::to_string(guard);
  wait_until("the guard to be gone", [&] {
    return !fs::exists(proc) ||
           gpurun::testing::slurp(proc + "/stat").find(") Z") != std::string::npos;
  });
  std::this_thread::sleep_for(200ms);
  CHECK(changed());  // nobody restored them
  CHECK(gpurun::energy::read_journal(gpus.journal()).size() == 2);

  // The next gpurun on this machine restores them at its start, before anything else.
  std::ofstream(dir.path / "b" / "stop") << 1;
  ElasticRun b(GPURUN_BINARY, dir.path / "b", 2, "[energy]\n",
               {GPURUN_FAKE_WORKER, (dir.path / "b").string(), "100"}, {"--energy", "on"}, "cpu",
               gpus.env());
  REQUIRE(b.wait(60s));
  CHECK_MESSAGE(b.code() == 0, b.diag());
  CHECK(gpus.limit(0) == 700);
  CHECK(gpus.limit(1) == 700);
  CHECK(fake::current_clocks(gpus.state, 0) == "");
  CHECK(fake::current_clocks(gpus.state, 1) == "");
  CHECK(gpurun::energy::read_journal(gpus.journal()).empty());
  const std::string err = gpurun::testing::slurp(dir.path / "b" / "gpurun.stderr");
  CHECK(err.find("restored GPU-") != std::string::npos);
  CHECK(err.find("and reset its locked clocks") != std::string::npos);
  CHECK(err.find("guard (pid " + std::to_string(guard) + ")") != std::string::npos);
  CHECK(b.events("power_journal").size() == 2);
}

TEST_CASE(
    "a fixed power limit is set while the job runs and restored at exit, after SIGTERM "
    "and after kill -9 of gpurun") {
  const std::string cfg = "[energy]\npower_limit_watts = 400\n";
  for (const std::string how : {"exit", "SIGTERM", "SIGKILL"}) {
    CAPTURE(how);
    TempDir dir("gpurun-energy");
    FakeGpus gpus(dir.path, gpus_drawing({600, 600}));
    if (how == "exit") std::ofstream(dir.path / "stop") << 12;
    ElasticRun run(GPURUN_BINARY, dir.path, 2, cfg, {GPURUN_FAKE_WORKER, dir.str(), "200"},
                   {"--energy", "on", "--grace-period", "2"}, "cpu", gpus.env());
    wait_until("the limit to be set", [&] { return gpus.limit(0) == 400 && gpus.limit(1) == 400; });
    if (how == "SIGTERM") ::kill(run.proc.pid, SIGTERM);
    if (how == "SIGKILL") ::kill(run.proc.pid, SIGKILL);
    REQUIRE(run.wait(60s));
    if (how == "exit") CHECK_MESSAGE(run.code() == 0, run.diag());
    if (how == "SIGKILL") {
      // gpurun is gone; its guard restores the limits when gpurun's pipe closes.
      wait_until(
          "the guard to restore the limits",
          [&] { return gpus.limit(0) == 700 && gpus.limit(1) == 700; }, 10s);
    }
    CHECK(gpus.limit(0) == 700);
    CHECK(gpus.limit(1) == 700);
  }
}

TEST_CASE(
    "no privilege to set power limits: one clear message, monitoring only, the job goes "
    "on") {
  TempDir dir("gpurun-energy");
  fake::State s = gpus_drawing({500});
  s.errors.push_back({"nvmlDeviceSetPowerManagementLimit", 4, std::nullopt});
  FakeGpus gpus(dir.path, s);
  std::ofstream(dir.path / "stop") << 2;
  ElasticRun run(GPURUN_BINARY, dir.path, 1, std::string("[energy]\npower_limit_watts = 400\n"),
                 {GPURUN_FAKE_WORKER, dir.str(), "200"}, {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(run.wait(60s));
  CHECK_MESSAGE(run.code() == 0, run.diag());
  const std::string err = gpurun::testing::slurp(dir.path / "gpurun.stderr");
  CHECK(err.find("needs root or CAP_SYS_ADMIN; monitoring only") != std::string::npos);
  CHECK(gpus.limit(0) == 700);
  CHECK(run.events("energy_epoch").size() == 3);  // monitoring went on: epochs 0, 1, 2
}

TEST_CASE(
    "power limits: a second job on the same GPUs is refused (monitoring only); a guard "
    "that dies makes gpurun restore the limits at once") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({600}));
  fs::create_directories(dir.path / "a");
  fs::create_directories(dir.path / "b");
  ElasticRun a(GPURUN_BINARY, dir.path / "a", 1, std::string("[energy]\npower_limit_watts = 400\n"),
               {GPURUN_FAKE_WORKER, (dir.path / "a").string(), "200"}, {"--energy", "on"}, "cpu",
               gpus.env());
  wait_until("job a's limit", [&] { return gpus.limit(0) == 400; });
  std::ofstream(dir.path / "b" / "stop") << 3;
  // Job b is configured differently (the lock directory of earlier versions, another TMPDIR):
  // the lock is the GPU's, machine-wide, so it is refused all the same.
  ElasticRun b(GPURUN_BINARY, dir.path / "b", 1, std::string("[energy]\npower_limit_watts = 300\n"),
               {GPURUN_FAKE_WORKER, (dir.path / "b").string(), "200"}, {"--energy", "on"}, "cpu",
               gpus.env({{"GPURUN_POWER_LOCK_DIR", (dir.path / "b").string()},
                         {"TMPDIR", (dir.path / "b").string()}}));
  REQUIRE(b.wait(60s));
  CHECK_MESSAGE(b.code() == 0, b.diag());
  const std::string berr = gpurun::testing::slurp(dir.path / "b" / "gpurun.stderr");
  CHECK(berr.find("is power-managed by another gpurun") != std::string::npos);
  CHECK(gpus.limit(0) == 400);             // job a's limit stayed
  CHECK(b.events("power_limit").empty());  // b changed nothing, so it restored nothing
  // Kill job a's guard (a child of job a's gpurun, found by its command line).
  pid_t guard = -1;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(line.substr(rp + 2));
    std::string state;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid != a.proc.pid) continue;
    if (gpurun::testing::slurp(e.path() / "cmdline").find("__power-guard") != std::string::npos)
      guard = static_cast<pid_t>(std::stol(name));
  }
  REQUIRE(guard > 1);
  REQUIRE(::kill(guard, SIGKILL) == 0);  // job a's guard: started by the gpurun this test ran
  wait_until(
      "job a to restore the limit itself", [&] { return gpus.limit(0) == 700; }, 10s);
  std::ofstream(dir.path / "a" / "stop") << 0;
  REQUIRE(a.wait(60s));
  CHECK_MESSAGE(a.code() == 0, a.diag());
  const std::string aerr = gpurun::testing::slurp(dir.path / "a" / "gpurun.stderr");
  CHECK(aerr.find("the power-limit guard (pid " + std::to_string(guard) + ") died") !=
        std::string::npos);
  CHECK(gpus.limit(0) == 700);
  // Job a put the limit back itself, so its entry left the journal: before, it stayed, and
  // the next gpurun "restored" a GPU nothing had left changed.
  CHECK(gpurun::energy::read_journal(gpus.journal()).empty());
}

TEST_CASE(
    "power limits: a GPU that leaves the job gets its original limit and clocks back (its "
    "lock and journal entry freed); back in the job, it gets them again") {
  // Before: a lent, yielded or given-back GPU stayed capped and locked by this job's guard
  // until the job ended, so whoever used it next got a capped GPU they could not manage.
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({600, 600}));
  const std::string energy =
      "[energy]\npower_limit_watts = 400\nlocked_clocks_mhz = [1200, 1500]\n";
  ElasticRun run(GPURUN_BINARY, dir.path, 2, energy, {GPURUN_FAKE_WORKER, dir.str(), "200"},
                 {"--energy", "on"}, "cpu", gpus.env());
  const auto capped = [&](unsigned i) {
    return gpus.limit(i) == 400 && fake::current_clocks(gpus.state, i) == "1200:1500";
  };
  const auto free_gpu = [&](unsigned i) {
    return gpus.limit(i) == 700 && fake::current_clocks(gpus.state, i).empty();
  };
  wait_until("both GPUs capped", [&] { return capped(0) && capped(1); });
  write_file(dir.path / "config.toml", "active_gpus = [0]\n" + energy);
  // The journal entry goes after the restore (a read between the two saw both entries).
  wait_until("GPU 1 to get its original limit and clocks back, its journal entry gone", [&] {
    return free_gpu(1) && gpurun::energy::read_journal(gpus.journal()).size() == 1;
  });
  CHECK(capped(0));
  auto journal = gpurun::energy::read_journal(gpus.journal());
  REQUIRE(journal.size() == 1);  // GPU 1 is no longer this job's to restore
  CHECK(journal[0].uuid == fake::read_state(gpus.state).gpus[0].uuid);
  write_file(dir.path / "config.toml", "active_gpus = [0, 1]\n" + energy);
  wait_until("GPU 1 capped again", [&] { return capped(1); });
  CHECK(gpurun::energy::read_journal(gpus.journal()).size() == 2);
  std::ofstream(dir.path / "stop") << 0;
  REQUIRE(run.wait(60s));
  CHECK_MESSAGE(run.code() == 0, run.diag());
  CHECK(free_gpu(0));
  CHECK(free_gpu(1));
  const std::string err = gpurun::testing::slurp(dir.path / "gpurun.stderr");
  CHECK(err.find("GPU [1] left the job: its original power limit and clocks restored") !=
        std::string::npos);
  CHECK(err.find("power limit 400 W on 2 GPUs (rejoined)") != std::string::npos);
}

TEST_CASE(
    "a job that trains all its epochs is not an early stop, whatever the threshold; "
    "without boundaries gpurun says early stop was not possible") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({300}));
  std::ofstream(dir.path / "stop") << 0;  // trains one epoch, reports no boundary, exits 0
  ElasticRun run(GPURUN_BINARY, dir.path, 1,
                 std::string("[energy]\ncost_threshold = 1\nhistory = \"h.jsonl\"\n"),
                 {GPURUN_FAKE_WORKER, dir.str(), "300"},
                 {"--energy", "on", "--energy-summary", (dir.path / "summary.json").string()},
                 "cpu", gpus.env());
  REQUIRE(run.wait(60s));
  CHECK_MESSAGE(run.code() == 0, run.diag());
  CHECK(run.events("early_stop").empty());
  CHECK(run.events("energy_epoch").size() == 1);
  const json::object sum = read_json(dir.path / "summary.json").at("summary").as_object();
  CHECK_FALSE(sum.at("stopped_early").as_bool());
  CHECK(num(sum.at("exit_code")) == 0);
  const json::object h = json::parse(gpurun::testing::slurp(dir.path / "h.jsonl")).as_object();
  CHECK(h.at("completed").as_bool());
  CHECK(gpurun::testing::slurp(dir.path / "gpurun.stderr")
            .find("early stop was not possible: the workers reported no epoch boundary") !=
        std::string::npos);
}

TEST_CASE("window_s: a worker without boundaries under --config gets time windows") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({300}));
  ElasticRun run(GPURUN_BINARY, dir.path, 1, std::string("[energy]\nwindow_s = 1\n"),
                 {"/bin/sleep", "3.5"}, {"--energy", "on"}, "cpu", gpus.env());
  REQUIRE(run.wait(60s));
  CHECK_MESSAGE(run.code() == 0, run.diag());
  size_t time_windows = 0;
  for (const auto& w : run.events("energy")) {
    if (w.at("kind").as_string() != "time") continue;
    ++time_windows;
    // About window_s each; a loaded machine may run the timer late, never a whole period.
    CHECK(num(w.at("seconds")) < 1.9);
  }
  CHECK(time_windows >= 3);
}

TEST_CASE(
    "a GPU whose energy counter cannot be read is charged from its power readings, and "
    "gpurun says so") {
  TempDir dir("gpurun-energy");
  fake::State s = gpus_drawing({300, 200});
  s.errors.push_back({"nvmlDeviceGetTotalEnergyConsumption", 3, 1u});
  FakeGpus gpus(dir.path, s);
  ElasticRun run(GPURUN_BINARY, dir.path, 2, std::nullopt, {"/bin/sleep", "2"},
                 {"--energy", "on", "--energy-summary", (dir.path / "summary.json").string()},
                 "cpu", gpus.env());
  REQUIRE(run.wait(30s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  const json::object sum = read_json(dir.path / "summary.json").at("summary").as_object();
  const double t = num(sum.at("seconds"));
  CHECK(num(sum.at("gpu_energy_j").as_object().at("0")) == doctest::Approx(300 * t).epsilon(0.08));
  CHECK(num(sum.at("gpu_energy_j").as_object().at("1")) == doctest::Approx(200 * t).epsilon(0.08));
  const std::string err = gpurun::testing::slurp(dir.path / "gpurun.stderr");
  CHECK(err.find("(slot 1): its energy counter cannot be read") != std::string::npos);
  CHECK(err.find("integrated from the power readings") != std::string::npos);
}

TEST_CASE("a power limit outside the GPUs' range is clamped, and the clamped value is reported") {
  TempDir dir("gpurun-energy");
  FakeGpus gpus(dir.path, gpus_drawing({600}));
  ElasticRun run(GPURUN_BINARY, dir.path, 1, std::string("[energy]\npower_limit_watts = 100\n"),
                 {GPURUN_FAKE_WORKER, dir.str(), "300"}, {"--energy", "on"}, "cpu", gpus.env());
  wait_until("the limit to be set", [&] { return gpus.limit(0) == 200; });
  std::ofstream(dir.path / "stop") << 1;
  REQUIRE(run.wait(60s));
  CHECK_MESSAGE(run.code() == 0, run.diag());
  const auto limits = run.events("power_limit");
  REQUIRE(!limits.empty());
  CHECK(num(limits.front().at("limit_w")) == 200);
  CHECK(num(limits.front().at("requested_w")) == 100);
  for (const auto& w : run.events("energy"))
    if (w.at("power_limit_w").is_number()) CHECK(num(w.at("power_limit_w")) == 200);
  CHECK(gpurun::testing::slurp(dir.path / "gpurun.stderr")
            .find("power limit 200 W on 1 GPU (fixed; 100 W asked, outside the GPUs' range)") !=
        std::string::npos);
  CHECK(gpus.limit(0) == 700);
}

namespace {
/// The state file gpurun said it simulates from ("… (state: PATH)" on its stderr), "" if none.
std::string simulated_state_path(const fs::path& stderr_file) {
  const std::string err = gpurun::testing::slurp(stderr_file);
  const auto at = err.find("(state: ");
  if (at == std::string::npos) return {};
  return err.substr(at + 8, err.find(')', at) - at - 8);
}
/// (exists, last write) of a file, to see that a run left it alone.
std::pair<bool, fs::file_time_type> stamp(const fs::path& p) {
  std::error_code ec;
  const auto t = fs::last_write_time(p, ec);
  return {!ec, ec ? fs::file_time_type{} : t};
}
}  // namespace

TEST_CASE("--simulate-gpus N: simulated GPUs, a power limit set on them, all in the run dir") {
  TempDir dir("gpurun-energy");
  const auto machine_journal = stamp("/var/lib/gpurun/power-journal.json");
  // The config names a history and a profile cache beside it: a simulated run's cost must
  // never be the best earlier run of a real job's threshold, so both are the run dir's.
  ElasticRun run(GPURUN_BINARY, dir.path, 2,
                 std::string("[energy]\npower_limit_watts = 500\nhistory = \"history.jsonl\"\n"
                             "profile_cache = \"cache.json\"\n"),
                 {GPURUN_FAKE_WORKER, dir.str(), "300"},
                 {"--simulate-gpus", "2", "--energy-summary", (dir.path / "summary.json").string(),
                  "--log-dir", (dir.path / "logs").string()},
                 "cpu", {{"HOME", dir.str()}});
  std::string state;
  wait_until("gpurun to say where the simulated GPUs are", [&] {
    state = simulated_state_path(dir.path / "gpurun.stderr");
    return !state.empty();
  });
  const fs::path run_dir = fs::path(state).parent_path();
  wait_until("the limit to be set on both", [&] {
    return fake::current_limit_w(state, 0) == 500 && fake::current_limit_w(state, 1) == 500;
  });
  CHECK(fs::is_regular_file(run_dir / "power-journal.json"));  // the journal: the run dir's
  std::ofstream(dir.path / "stop") << 1;
  REQUIRE(run.wait(60s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  CHECK(gpurun::testing::slurp(dir.path / "gpurun.stderr")
            .find("gpurun: energy: 2 simulated GPU(s), no NVIDIA driver used") !=
        std::string::npos);
  const auto monitor = run.events("energy_monitor");
  REQUIRE(monitor.size() == 1);
  REQUIRE(monitor[0].at("gpus").as_array().size() == 2);
  const json::object sum = read_json(dir.path / "summary.json").at("summary").as_object();
  for (const char* slot : {"0", "1"}) CHECK(num(sum.at("gpu_energy_j").as_object().at(slot)) > 0);
  // Nothing outside the run dir: not the machine's journal, not ~/.local/state, nor the
  // test's XDG_STATE_HOME.
  CHECK(stamp("/var/lib/gpurun/power-journal.json") == machine_journal);
  CHECK_FALSE(fs::exists(dir.path / ".local" / "state" / "gpurun"));
  CHECK_FALSE(fs::exists(dir.path / "xdg" / "state" / "gpurun" / "power-journal.json"));
  // Nor the config's history and profile cache: the run dir's, which --log-dir keeps, with
  // the simulated GPUs' state.
  CHECK_FALSE(fs::exists(dir.path / "history.jsonl"));
  CHECK_FALSE(fs::exists(dir.path / "cache.json"));
  CHECK(fs::is_regular_file(run_dir / "history.jsonl"));
  CHECK(fs::is_regular_file(run_dir / "simulated-gpus.txt"));
  CHECK(gpurun::testing::slurp(dir.path / "gpurun.stderr")
            .find("gpurun: energy: --simulate-gpus: for this run [energy] history " +
                  (dir.path / "history.jsonl").string() + " is " +
                  (run_dir / "history.jsonl").string() + ", profile_cache " +
                  (dir.path / "cache.json").string() + " is " +
                  (run_dir / "power-cache.json").string() +
                  ": simulated GPUs' costs and limits never reach a real job's") !=
        std::string::npos);
}

TEST_CASE("--simulate-gpus FILE: the file's GPUs, the file left as it was; too few GPUs refused") {
  TempDir dir("gpurun-energy");
  const std::string file = (dir.path / "my-gpus.txt").string();
  fake::write_state(file, gpus_drawing({100, 300}));
  const std::string before = gpurun::testing::slurp(file);
  ElasticRun run(
      GPURUN_BINARY, dir.path, 2, std::nullopt, {"/bin/sleep", "2"},
      {"--simulate-gpus", file, "--energy-summary", (dir.path / "summary.json").string()});
  REQUIRE(run.wait(30s));
  REQUIRE_MESSAGE(run.code() == 0, run.diag());
  const json::object sum = read_json(dir.path / "summary.json").at("summary").as_object();
  const double t = num(sum.at("seconds"));
  CHECK(num(sum.at("gpu_energy_j").as_object().at("0")) == doctest::Approx(100 * t).epsilon(0.1));
  CHECK(num(sum.at("gpu_energy_j").as_object().at("1")) == doctest::Approx(300 * t).epsilon(0.1));
  CHECK(gpurun::testing::slurp(file) == before);  // the run worked on its copy

  TempDir d2("gpurun-energy");
  ElasticRun few(GPURUN_BINARY, d2.path, 2, std::nullopt, {"/bin/true"}, {"--simulate-gpus", "1"});
  REQUIRE(few.wait(30s));
  CHECK(few.code() == 2);
  CHECK(gpurun::testing::slurp(d2.path / "gpurun.stderr")
            .find("--simulate-gpus 1 gives 1 GPU(s), but slot 1 needs GPU 1: simulate at least "
                  "2") != std::string::npos);
  TempDir d3("gpurun-energy");
  std::ofstream(d3.path / "bad.txt") << "gpu 0 min_w=abc\n";
  ElasticRun bad(GPURUN_BINARY, d3.path, 1, std::nullopt, {"/bin/true"},
                 {"--simulate-gpus", (d3.path / "bad.txt").string()});
  REQUIRE(bad.wait(30s));
  CHECK(bad.code() == 2);
  const std::string err = gpurun::testing::slurp(d3.path / "gpurun.stderr");
  CHECK(err.find("--simulate-gpus " + (d3.path / "bad.txt").string() + ": ") != std::string::npos);
  CHECK(err.find("line 1") != std::string::npos);
}
