#include "control/metrics.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "control/dcgm_job_files.hpp"
#include "control/slot_state.hpp"
#include "gpurun_process.hpp"
#include "supervisor/event_log.hpp"

namespace gpurun::control {
namespace {

namespace fs = std::filesystem;

/// The text as a map "name{labels}" -> value, checking every line's syntax and that each
/// family's HELP and TYPE come once, before its samples.
struct Parsed {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;  // family -> type
  std::map<std::string, int> helps;          // family -> HELP lines
};

Parsed parse(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) \S.*)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))");
  static const std::regex sample(
      R"re(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+))re");
  Parsed p;
  std::istringstream in(text);
  std::string line;
  std::smatch m;
  REQUIRE(!text.empty());
  CHECK(text.back() == '\n');
  while (std::getline(in, line)) {
    INFO("line: " << line);
    if (std::regex_match(line, m, help)) {
      ++p.helps[m[1]];
    } else if (std::regex_match(line, m, type)) {
      CHECK(p.types.count(m[1]) == 0);
      p.types[m[1]] = m[2];
    } else {
      REQUIRE(std::regex_match(line, m, sample));
      std::string family = m[1];
      for (const char* suffix : {"_bucket", "_sum", "_count"})
        if (p.types.count(family) == 0 && family.size() > std::string(suffix).size() &&
            family.compare(family.size() - std::string(suffix).size(), std::string::npos, suffix) ==
                0)
          family.resize(family.size() - std::string(suffix).size());
      CHECK_MESSAGE(p.types.count(family) == 1, "a sample before its # TYPE: " << family);
      const std::string key = line.substr(0, line.rfind(' '));
      CHECK_MESSAGE(p.samples.count(key) == 0, "a sample twice: " << key);
      p.samples[key] = m[5] == "+Inf" ? 1e300 : std::stod(m[5]);
    }
  }
  for (const auto& help : p.helps) CHECK_MESSAGE(help.second == 1, help.first);
  CHECK(p.helps.size() == p.types.size());
  return p;
}

SlotStatus slot(int gpu, SlotState state, int rank) {
  SlotStatus s;
  s.gpu = gpu;
  s.state = state;
  s.rank = rank;
  s.generation = 3;
  return s;
}

MetricsSnapshot two_gpus() {
  MetricsSnapshot snap;
  snap.job = "exp-1";
  snap.hostname = "node-a";
  snap.run.elastic = true;
  snap.run.generation = 3;
  snap.run.current_active = {0};
  snap.run.desired_active = {0};
  snap.run.slots = {slot(0, SlotState::kActive, 0), slot(1, SlotState::kParked, -1)};
  snap.world_size = 1;
  snap.gpus[0] = GpuLabels{0, "GPU-aaaa", "NVIDIA H200"};
  snap.gpus[1] = GpuLabels{1, "GPU-bbbb", "NVIDIA H200"};
  EnergyStatus e;
  e.slots[0].power_w = 612.5;
  e.slots[0].job_energy_j = 12345.5;
  e.slots[0].epoch_energy_j = 45.0;
  e.slots[0].power_limit_w = 500;
  e.slots[1].power_w = 80;
  e.slots[1].job_energy_j = 300;
  e.epochs = 2;
  e.cost_total_j = 5000;
  e.predicted_next_cost_j = 2600;
  e.threshold_j = 9000;
  snap.energy = e;
  snap.steps = StepProgress{120, 4.5};
  return snap;
}

const std::string kGpu0 =
    R"(job="exp-1",slot="0",node="0",gpu="0",UUID="GPU-aaaa",modelName="NVIDIA H200",Hostname="node-a")";
const std::string kGpu1 =
    R"(job="exp-1",slot="1",node="0",gpu="1",UUID="GPU-bbbb",modelName="NVIDIA H200",Hostname="node-a")";

std::string resize_record(const std::string& kind, double total_ms, const std::string& phases) {
  return supervisor::EventLog::format_record(std::chrono::system_clock::now(), "resize",
                                             JsonObject()
                                                 .add("generation", 4)
                                                 .add("kind", kind)
                                                 .add("total_ms", total_ms)
                                                 .add_raw("phases_ms", phases));
}

TEST_CASE("metrics: each GPU's energy, power, limit, state and rank with DCGM exporter's labels") {
  const MetricsSnapshot snap = two_gpus();
  const Parsed p = parse(render_metrics(snap, ResizeMetrics{}));
  CHECK(p.types.at("gpurun_gpu_energy_joules_total") == "counter");
  CHECK(p.samples.at("gpurun_gpu_energy_joules_total{" + kGpu0 + "}") == 12345.5);
  CHECK(p.samples.at("gpurun_gpu_energy_joules_total{" + kGpu1 + "}") == 300);
  CHECK(p.types.at("gpurun_gpu_power_watts") == "gauge");
  CHECK(p.samples.at("gpurun_gpu_power_watts{" + kGpu0 + "}") == 612.5);
  CHECK(p.samples.at("gpurun_gpu_power_limit_watts{" + kGpu0 + "}") == 500);
  CHECK(p.samples.count("gpurun_gpu_power_limit_watts{" + kGpu1 + "}") == 0);  // none set
  CHECK(p.samples.at("gpurun_gpu_epoch_energy_joules{" + kGpu0 + "}") == 45);
  CHECK(p.samples.at("gpurun_slot_rank{" + kGpu0 + "}") == 0);
  CHECK(p.samples.at("gpurun_slot_rank{" + kGpu1 + "}") == -1);
  CHECK(p.samples.at("gpurun_slot_state{" + kGpu0 + R"(,state="active"})") == 1);
  CHECK(p.samples.at("gpurun_slot_state{" + kGpu0 + R"(,state="parked"})") == 0);
  CHECK(p.samples.at("gpurun_slot_state{" + kGpu1 + R"(,state="parked"})") == 1);
  CHECK(p.samples.at("gpurun_slot_info{" + kGpu0 + R"(,rank="0",state="active"})") == 1);
  CHECK(p.samples.at(R"(gpurun_generation{job="exp-1"})") == 3);
  CHECK(p.samples.at(R"(gpurun_world_size{job="exp-1"})") == 1);
  CHECK(p.samples.at(R"(gpurun_steps_total{job="exp-1"})") == 120);
  CHECK(p.samples.at(R"(gpurun_step_rate{job="exp-1"})") == 4.5);
  CHECK(p.samples.at(R"(gpurun_energy_cost_joules_total{job="exp-1"})") == 5000);
  CHECK(p.samples.at(R"(gpurun_energy_predicted_next_epoch_cost_joules{job="exp-1"})") == 2600);
  CHECK(p.samples.at(R"(gpurun_energy_cost_threshold_joules{job="exp-1"})") == 9000);
  CHECK(p.samples.at(R"(gpurun_energy_early_stopped{job="exp-1"})") == 0);
  CHECK(p.samples.at(R"(gpurun_energy_epochs_total{job="exp-1"})") == 2);
}

TEST_CASE("metrics: every slot has exactly one state at 1, lent/yielded/paused among them") {
  MetricsSnapshot snap = two_gpus();
  snap.run.slots.push_back(slot(2, SlotState::kParked, -1));
  snap.run.slots.push_back(slot(3, SlotState::kStandby, -1));
  snap.gpus.clear();
  snap.lent = {1};
  snap.yielded = {2};
  CHECK(metrics_slot_state(snap.run.slots[0], snap) == "active");
  CHECK(metrics_slot_state(snap.run.slots[1], snap) == "lent");
  CHECK(metrics_slot_state(snap.run.slots[2], snap) == "yielded");
  CHECK(metrics_slot_state(snap.run.slots[3], snap) == "standby");
  const Parsed p = parse(render_metrics(snap, ResizeMetrics{}));
  for (int s = 0; s < 4; ++s) {
    double ones = 0;
    for (const std::string& state : metrics_slot_states())
      ones += p.samples.at(fmt::format(
          R"(gpurun_slot_state{{job="exp-1",slot="{}",node="0",Hostname="node-a",state="{}"}})", s,
          state));
    CHECK(ones == 1);
  }
  SUBCASE("a config that pauses the job: its parked slots are 'paused'") {
    snap.run.current_active.clear();
    snap.run.desired_active.clear();
    snap.run.slots[0] = slot(0, SlotState::kParked, -1);
    CHECK(metrics_slot_state(snap.run.slots[0], snap) == "paused");
    CHECK(metrics_slot_state(snap.run.slots[1], snap) == "lent");  // lent wins
  }
}

TEST_CASE("metrics: every slot state has a gpurun_slot_state gauge at 1, standby included") {
  // A slot in any state (kAllSlotStates), in a job that trains, lends, yields or is paused, shows
  // one of the states /metrics lists, and that state's gauge is 1.
  const std::vector<std::string>& states = metrics_slot_states();
  for (const SlotState st : kAllSlotStates) {
    for (const char* how : {"training", "lent", "yielded", "paused"}) {
      CAPTURE(to_string(st));
      CAPTURE(how);
      MetricsSnapshot snap = two_gpus();
      snap.run.slots = {slot(0, st, -1)};
      snap.gpus.clear();
      if (std::string(how) == "lent") snap.lent = {0};
      if (std::string(how) == "yielded") snap.yielded = {0};
      if (std::string(how) == "paused") {
        snap.run.current_active.clear();
        snap.run.desired_active.clear();
      }
      const std::string name = metrics_slot_state(snap.run.slots[0], snap);
      CHECK(std::find(states.begin(), states.end(), name) != states.end());
      const Parsed p = parse(render_metrics(snap, ResizeMetrics{}));
      CHECK(
          p.samples.at(fmt::format(
              R"(gpurun_slot_state{{job="exp-1",slot="0",node="0",Hostname="node-a",state="{}"}})",
              name)) == 1);
    }
  }
}

TEST_CASE("metrics: another node's slot is labelled node=k and gets none of node 0's GPU labels") {
  MetricsSnapshot snap = two_gpus();
  snap.run.slots.push_back(slot(1001, SlotState::kActive, 1));
  snap.gpus[1001] = GpuLabels{1, "GPU-bbbb", "NVIDIA H200"};  // even if a caller mixed them up
  const Parsed p = parse(render_metrics(snap, ResizeMetrics{}));
  CHECK(p.samples.at(R"(gpurun_slot_rank{job="exp-1",slot="1001",node="1"})") == 1);
  for (const auto& sample : p.samples)
    if (sample.first.find(R"(slot="1001")") != std::string::npos) {
      CHECK(sample.first.find("UUID") == std::string::npos);
      CHECK(sample.first.find("Hostname") == std::string::npos);
    }
}

TEST_CASE("metrics: resizes by kind, their duration histogram and phases, from resize events") {
  ResizeMetrics r;
  const Parsed before = parse(render_metrics(two_gpus(), r));
  // Every kind is there at 0 before the first resize (rate() and increase() see it start).
  for (const std::string& k : ResizeMetrics::kinds())
    CHECK(before.samples.at(R"(gpurun_resizes_total{job="exp-1",kind=")" + k + "\"}") == 0);
  r.on_event("resize", resize_record("shrink", 1630.2, R"({"decision":812.1,"ready":801.5})"));
  r.on_event("decision", resize_record("grow", 1.0, "{}"));  // not a resize event: ignored
  r.on_event("resize", resize_record("grow", 7200.0, R"({"decision":5000,"ready":2200})"));
  r.on_event("resize", resize_record("grow", 400.0, R"({"decision":400})"));
  r.on_event("resize", R"({"event": "resize", "kind": 3})");  // unreadable: skipped
  CHECK(r.bad_records() == 1);
  const Parsed p = parse(render_metrics(two_gpus(), r));
  CHECK(p.types.at("gpurun_resizes_total") == "counter");
  CHECK(p.samples.at(R"(gpurun_resizes_total{job="exp-1",kind="grow"})") == 2);
  CHECK(p.samples.at(R"(gpurun_resizes_total{job="exp-1",kind="shrink"})") == 1);
  CHECK(p.types.at("gpurun_resize_duration_seconds") == "histogram");
  const std::string grow = R"(job="exp-1",kind="grow")";
  CHECK(p.samples.at("gpurun_resize_duration_seconds_bucket{" + grow + R"(,le="0.25"})") == 0);
  CHECK(p.samples.at("gpurun_resize_duration_seconds_bucket{" + grow + R"(,le="0.5"})") == 1);
  CHECK(p.samples.at("gpurun_resize_duration_seconds_bucket{" + grow + R"(,le="5"})") == 1);
  CHECK(p.samples.at("gpurun_resize_duration_seconds_bucket{" + grow + R"(,le="10"})") == 2);
  CHECK(p.samples.at("gpurun_resize_duration_seconds_bucket{" + grow + R"(,le="+Inf"})") == 2);
  CHECK(p.samples.at("gpurun_resize_duration_seconds_count{" + grow + "}") == 2);
  CHECK(p.samples.at("gpurun_resize_duration_seconds_sum{" + grow + "}") == doctest::Approx(7.6));
  CHECK(p.samples.at(R"(gpurun_resize_phase_seconds_total{job="exp-1",phase="decision"})") ==
        doctest::Approx(6.2121));
  // Counters never go down from one scrape to the next.
  for (const auto& sample : before.samples)
    if (sample.first.rfind("gpurun_resize", 0) == 0)
      CHECK(p.samples.at(sample.first) >= sample.second);
}

TEST_CASE("metrics: label values are escaped; a job id with quotes stays one label") {
  MetricsSnapshot snap = two_gpus();
  snap.job = "a\"b\\c\nd";
  const std::string text = render_metrics(snap, ResizeMetrics{});
  CHECK(text.find(R"(gpurun_generation{job="a\"b\\c\nd"} 3)") != std::string::npos);
  parse(text);
}

TEST_CASE("metrics: without an energy monitor or progress, no energy or step metrics") {
  MetricsSnapshot snap = two_gpus();
  snap.energy.reset();
  snap.steps.reset();
  const Parsed p = parse(render_metrics(snap, ResizeMetrics{}));
  CHECK(p.types.count("gpurun_gpu_energy_joules_total") == 0);
  CHECK(p.types.count("gpurun_steps_total") == 0);
  CHECK(p.types.count("gpurun_slot_state") == 1);
}

TEST_CASE("StepRate: steps per second over the readings' step times; 0 once steps stop") {
  StepRate r(10);
  const uint64_t s = 1'000'000'000;
  CHECK(r.observe(0, 0, 100 * s) == 0);                                  // no step yet
  CHECK(r.observe(10, 100 * s, 100 * s) == 0);                           // one point: no rate
  CHECK(r.observe(30, 102 * s, 102 * s) == 10);                          // 20 steps in 2 s
  CHECK(r.observe(30, 102 * s, 103 * s) == 10);                          // same step again
  CHECK(r.observe(70, 110 * s, 110 * s) == 6);                           // 60 steps in 10 s
  CHECK(r.observe(90, 115 * s, 115 * s) == doctest::Approx(60.0 / 13));  // from 102 s on
  CHECK(r.observe(90, 115 * s, 126 * s) == 0);  // nothing for over 10 s: stopped
  CHECK(r.observe(5, 130 * s, 130 * s) == 0);   // a restart from step 0: starts over
  CHECK(r.observe(15, 131 * s, 131 * s) == 10);
}

TEST_CASE("DcgmJobFiles: one file per held GPU, named by its index, holding the job id") {
  gpurun::testing::TempDir tmp("gpurun-dcgm");
  const fs::path dir = tmp.path / "jobs";
  const auto content = [&](const std::string& name) {
    std::ifstream in(dir / name);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  {
    DcgmJobFiles files(dir.string(), "exp-1");
    CHECK(fs::is_directory(dir));
    CHECK(files.update({"0", "1"}).empty());
    CHECK(content("0") == "exp-1\n");
    CHECK(content("1") == "exp-1\n");
    CHECK(files.update({"0"}).empty());  // GPU 1 parked, lent or yielded: its file goes
    CHECK_FALSE(fs::exists(dir / "1"));
    CHECK(files.update({"0", "1"}).empty());  // back
    CHECK(content("1") == "exp-1\n");
    // Another job's id replaced GPU 1's file: it is not ours to remove.
    std::ofstream(dir / "1") << "other\n";
    CHECK(files.update({"0"}).empty());
    CHECK(content("1") == "other\n");
    std::ofstream(dir / "7") << "someone\n";
  }
  // The job ends: its files go, nobody else's.
  CHECK_FALSE(fs::exists(dir / "0"));
  CHECK(content("1") == "other\n");
  CHECK(content("7") == "someone\n");
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.insert(e.path().filename().string());
  CHECK(left == std::set<std::string>{"1", "7"});  // no temp file left
}

TEST_CASE("DcgmJobFiles: a path that is not a directory is refused, naming it") {
  gpurun::testing::TempDir tmp("gpurun-dcgm");
  const fs::path file = tmp.path / "f";
  std::ofstream(file) << "x";
  try {
    DcgmJobFiles files(file.string(), "exp-1");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("--dcgm-job-dir " + file.string() + ": cannot use it") == 0);
  }
}

}  // namespace
}  // namespace gpurun::control
