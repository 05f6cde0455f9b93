#include "energy/power_profiler.hpp"

#include <doctest/doctest.h>

#include "gpurun_process.hpp"

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>

#include <boost/json.hpp>

#include "check_text.hpp"
#include "gpurun/error.hpp"

using namespace gpurun::energy;
namespace fs = std::filesystem;

namespace {

// Synthetic GPU: draws min(limit, 600) W and runs 10·sqrt(power/600) steps/s. For the first
// `transient` steps after each limit change it is slow and hot (half speed, 700 W), so rows
// that included warm-up steps would come out different.
struct FakeGpu {
  double t = 1000.0, e = 0.0;
  int64_t steps = 0;
  unsigned applied = 0;
  int64_t since_change = 0;
  int64_t transient = 10;
  // Temperature (tau_s > 0): first-order lag toward 30 °C + 0.1 °C/W of the draw, time
  // constant tau_s; starts at 90 °C (600 W's steady value).
  double tau_s = 0, temp_c = 90;
  std::optional<double> reading() const {  // as NVML reports it: whole degrees
    return tau_s > 0 ? std::optional<double>(std::floor(temp_c)) : std::nullopt;
  }

  static double power(unsigned limit) { return std::min(double(limit), 600.0); }
  static double speed(unsigned limit) { return 10.0 * std::sqrt(power(limit) / 600.0); }

  // One step under `limit`.
  void step(unsigned limit) {
    if (limit != applied) {
      applied = limit;
      since_change = 0;
    }
    double p = power(limit), v = speed(limit);
    if (since_change < transient) {
      p = 700.0;
      v /= 2;
    }
    const double dt = 1.0 / v;
    t += dt;
    e += p * dt;
    if (tau_s > 0) temp_c += (30.0 + 0.1 * p - temp_c) * (1 - std::exp(-dt / tau_s));
    ++steps;
    ++since_change;
  }
};

// Runs the profiler against the fake until done (at most 100000 steps), observing after every
// step; returns the rows in the order take_finished_row() gave them.
std::vector<ProfileRow> run(PowerProfiler& p, FakeGpu& gpu) {
  std::vector<ProfileRow> taken;
  p.observe(gpu.t, gpu.steps, gpu.e, gpu.reading());
  while (!p.done() && gpu.steps < 100000) {
    gpu.step(p.limit_w());
    p.observe(gpu.t, gpu.steps, gpu.e, gpu.reading());
    while (auto r = p.take_finished_row()) taken.push_back(*r);
  }
  return taken;
}

ProfilerOptions options(double eta) {
  ProfilerOptions o;
  o.max_w = 700;
  o.min_w = 300;
  o.step_w = 100;
  o.eta = eta;
  o.max_power_w = 700;  // one GPU, maximum limit 700 W
  return o;             // warmup 10, measure 40 (the defaults)
}

// A fresh directory under the temp dir, removed at scope exit (the tests' shared one).
using gpurun::testing::TempDir;

using gpurun::testing::what_of;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("limits to try: max, max − step, … while ≥ min") {
  ProfilerOptions o = options(0.5);
  o.step_w = 25;
  CHECK(PowerProfiler(o).limits().size() == 17);  // 700, 675, …, 300: (700 − 300)/25 + 1
  o.step_w = 100;
  o.min_w = 310;
  CHECK(PowerProfiler(o).limits() == std::vector<unsigned>{700, 600, 500, 400});
  o.min_w = 700;
  CHECK(PowerProfiler(o).limits() == std::vector<unsigned>{700});
  o.min_w = 800;  // above max
  CHECK(what_of([&] { PowerProfiler{o}; }).find("at least the lowest (800 W)") !=
        std::string::npos);
  o = options(0.5);
  o.measure_steps = 0;
  CHECK_THROWS_AS(PowerProfiler{o}, gpurun::Error);
  o = options(1.5);
  CHECK_THROWS_AS(PowerProfiler{o}, gpurun::Error);
}

TEST_CASE("the profiler picks the limit a hand calculation picks; warm-up steps are excluded") {
  // cost/step(limit) = (η·P + (1 − η)·700) / v, with P = min(limit, 600), v = 10·sqrt(P/600).
  // η = 7/12 puts the optimum of (η·P + (1−η)·700)/sqrt(P) at P = (1−η)·700/η = 500 W:
  //   700: P 600, v 10      → (350 + 291.667)/10      = 64.1667 J
  //   600: P 600, v 10      → 64.1667 J (tie with 700)
  //   500: P 500, v 9.12871 → (291.667 + 291.667)/9.12871 = 63.9010 J   ← minimum
  //   400: P 400, v 8.16497 → (233.333 + 291.667)/8.16497 = 64.2991 J
  //   300: P 300, v 7.07107 → (175 + 291.667)/7.07107     = 65.9966 J
  PowerProfiler p(options(7.0 / 12.0));
  CHECK(p.limit_w() == 700);
  CHECK_THROWS_AS(p.chosen_w(), gpurun::InvariantError);
  FakeGpu gpu;
  const std::vector<ProfileRow> taken = run(p, gpu);
  REQUIRE(p.done());
  CHECK(p.chosen_w() == 500);
  CHECK(p.limit_w() == 500);
  REQUIRE(taken.size() == 5);
  REQUIRE(p.rows().size() == 5);
  const unsigned want_limits[] = {700, 600, 500, 400, 300};
  const double want_cost[] = {64.1667, 64.1667, 63.9010, 64.2991, 65.9966};
  for (int i = 0; i < 5; ++i) {
    const ProfileRow& r = taken[i];
    const unsigned l = want_limits[i];
    CAPTURE(l);
    CHECK(r.limit_w == l);
    // Exactly the 40 measured steps at steady state: seconds 40/v, energy P·40/v. A row that
    // included the 10 warm-up steps (half speed, 700 W) would have more seconds and energy.
    CHECK(r.steps == 40);
    CHECK(r.seconds == doctest::Approx(40.0 / FakeGpu::speed(l)));
    CHECK(r.energy_j == doctest::Approx(FakeGpu::power(l) * 40.0 / FakeGpu::speed(l)));
    CHECK(r.steps_per_s == doctest::Approx(FakeGpu::speed(l)));
    CHECK(r.avg_power_w == doctest::Approx(FakeGpu::power(l)));
    CHECK(r.cost_per_step == doctest::Approx(want_cost[i]).epsilon(1e-5));
  }
  // 5 limits × (10 warm-up + 40 measured) = 250 steps.
  CHECK(gpu.steps == 250);
  CHECK_FALSE(p.take_finished_row().has_value());
  // Once done, observations change nothing.
  p.observe(gpu.t + 100, gpu.steps + 1000, gpu.e + 1e6);
  CHECK(p.rows().size() == 5);
  CHECK(p.chosen_w() == 500);
}

TEST_CASE("ties go to the higher limit; η = 1 picks the lowest") {
  // η = 0.5: 700 and 600 both cost (300 + 350)/10 = 65 J/step; 500: 65.7267; 400: 67.3610;
  // 300: 70.7107 → 700 (the higher of the tie).
  PowerProfiler half(options(0.5));
  FakeGpu g1;
  run(half, g1);
  REQUIRE(half.done());
  CHECK(half.rows()[0].cost_per_step == doctest::Approx(65.0));
  CHECK(half.rows()[1].cost_per_step == doctest::Approx(65.0));
  CHECK(half.chosen_w() == 700);
  // η = 1 (energy only): cost/step = P/v = sqrt(600·P)/10, increasing in P → 300 W
  // (sqrt(180000)/10 = 42.4264 J).
  PowerProfiler energy_only(options(1.0));
  FakeGpu g2;
  run(energy_only, g2);
  CHECK(energy_only.chosen_w() == 300);
  CHECK(energy_only.rows().back().cost_per_step == doctest::Approx(42.4264));
}

TEST_CASE(
    "cool-down: each limit is measured once the temperature has settled, not while the GPU is "
    "still hot from the limit before") {
  // τ = 4 s: from 600 W's 90 °C down to 500 W's 80 °C takes ~13 s to settle within 1 °C over
  // 5 s; the 10 warm-up steps alone last ~1.5 s.
  const auto steady_c = [](unsigned limit) { return 30.0 + 0.1 * FakeGpu::power(limit); };
  ProfilerOptions o = options(0.5);
  o.cooldown_max_s = 60;
  o.settle_window_s = 5;
  PowerProfiler p(o);
  FakeGpu gpu;
  gpu.tau_s = 4;
  const std::vector<ProfileRow> rows = run(p, gpu);
  REQUIRE(rows.size() == 5);
  for (const ProfileRow& r : rows) {
    CAPTURE(r.limit_w);
    CHECK(std::string(cooldown_name(r.cooldown)) == "settled");
    CHECK(r.warmup_s >= 5.0);
    REQUIRE(r.temp_c.has_value());
    CHECK(std::abs(*r.temp_c - steady_c(r.limit_w)) <= 1.5);
    CHECK(r.to_json_fields().find("\"cooldown\": \"settled\"") != std::string::npos);
  }
  CHECK(rows[2].warmup_s > 10.0);  // 600 → 500 W: 10 °C to shed

  // The same GPU without the cool-down: the lower limits are measured while still hot.
  o.cooldown_max_s = 0;
  PowerProfiler hot(o);
  FakeGpu gpu2;
  gpu2.tau_s = 4;
  const std::vector<ProfileRow> hot_rows = run(hot, gpu2);
  REQUIRE(hot_rows.size() == 5);
  CHECK(std::string(cooldown_name(hot_rows[2].cooldown)) == "off");
  REQUIRE(hot_rows[2].temp_c.has_value());
  CHECK(*hot_rows[2].temp_c - steady_c(500) >= 5.0);
  CHECK(hot_rows[2].warmup_s < 3.0);  // the 10 warm-up steps alone
}

TEST_CASE("cool-down: bounded by cooldown_max_s; without a temperature reading there is none") {
  ProfilerOptions o = options(0.5);
  o.cooldown_max_s = 6;
  o.settle_window_s = 5;
  PowerProfiler p(o);
  FakeGpu gpu;
  gpu.tau_s = 20;  // sheds 10 °C with τ = 20 s: still ~2 °C a window after 6 s
  const std::vector<ProfileRow> rows = run(p, gpu);
  REQUIRE(rows.size() == 5);
  for (size_t i = 2; i < rows.size(); ++i) {  // 500 W and below: still cooling
    CAPTURE(rows[i].limit_w);
    CHECK(std::string(cooldown_name(rows[i].cooldown)) == "timeout");
    CHECK(rows[i].warmup_s >= 6.0);
    CHECK(rows[i].warmup_s < 6.2);  // the first observation at or past the bound
  }
  // No sensor: the warm-up is the 10 steps alone, and the row says why.
  o.cooldown_max_s = 20;
  PowerProfiler none(o);
  FakeGpu g2;
  const std::vector<ProfileRow> plain = run(none, g2);
  REQUIRE(plain.size() == 5);
  for (const ProfileRow& r : plain) {
    CHECK(std::string(cooldown_name(r.cooldown)) == "no temperature");
    CHECK_FALSE(r.temp_c.has_value());
    CHECK(r.to_json_fields().find("\"temp_c\": null") != std::string::npos);
  }
  CHECK(g2.steps == 250);
  o.settle_window_s = 0;
  CHECK(what_of([&] { PowerProfiler{o}; }).find("settle window (0 s)") != std::string::npos);
}

TEST_CASE("a step counter going back, or interrupt(), restarts the current limit's warm-up") {
  ProfilerOptions o = options(0.5);
  o.warmup_steps = 2;
  o.measure_steps = 4;
  PowerProfiler p(o);
  // At 1 step/s and 100 W: warm-up starts at step 0, ends at step 2; measure from step 2.
  p.observe(0, 0, 0);
  p.observe(2, 2, 200);
  p.observe(5, 5, 500);  // 3 of 4 measured steps
  p.observe(6, 1, 0);    // workers restarted: counters back to 1 step, 0 J → warm-up again
  p.observe(8, 3, 200);  // warm-up over (2 steps since the restart)
  p.observe(10, 5, 400);
  CHECK(p.rows().empty());  // only 2 measured since the restart
  p.observe(12, 7, 600);    // 4 steps in 4 s, 400 J since step 3
  REQUIRE(p.rows().size() == 1);
  CHECK(p.rows()[0].limit_w == 700);
  CHECK(p.rows()[0].steps == 4);
  CHECK(p.rows()[0].seconds == doctest::Approx(4));
  CHECK(p.rows()[0].energy_j == doctest::Approx(400));
  // cost/step = 0.5·100 + 0.5·700·1 = 400 J.
  CHECK(p.rows()[0].cost_per_step == doctest::Approx(400));
  CHECK(p.limit_w() == 600);
  // interrupt() during the next limit's measurement drops it.
  p.observe(14, 9, 800);  // warm-up at 600 W over
  p.observe(16, 11, 1000);
  p.interrupt();
  p.observe(17, 12, 1100);  // warm-up starts again here
  p.observe(19, 14, 1300);  // … and ends here
  p.observe(22, 17, 1600);
  CHECK(p.rows().size() == 1);
  p.observe(23, 18, 1700);  // 4 steps since 14
  CHECK(p.rows().size() == 2);
  CHECK(p.rows()[1].limit_w == 600);
  CHECK(p.rows()[1].seconds == doctest::Approx(4));
}

TEST_CASE("profile cache: store, replace, look up by every key field, bad file named") {
  TempDir dir;
  const fs::path c = dir.path / "power_profile.json";
  const ProfileKey a{"fmnist_train", "bs=256", "NVIDIA H200", 2, 0.5};
  ProfileKey b = a;
  b.gpus = 4;
  ProfileKey other_eta = a;
  other_eta.eta = 0.8;
  CHECK_FALSE(cached_limit(c, a).has_value());  // no file

  ProfileRow row;
  row.limit_w = 500;
  row.steps = 40;
  row.seconds = 4.5;
  row.energy_j = 2250;
  store_limit(c, a, 500, {row});
  CHECK(cached_limit(c, a) == 500u);
  CHECK_FALSE(cached_limit(c, b).has_value());
  CHECK_FALSE(cached_limit(c, other_eta).has_value());
  store_limit(c, b, 450, {});
  store_limit(c, a, 525, {row});  // replaces a's entry
  CHECK(cached_limit(c, a) == 525u);
  CHECK(cached_limit(c, b) == 450u);
  const auto doc = boost::json::parse(slurp(c)).as_object();
  const auto& entries = doc.at("entries").as_array();
  CHECK(entries.size() == 2);
  CHECK(entries.at(0)
            .as_object()
            .at("rows")
            .as_array()
            .at(0)
            .as_object()
            .at("energy_j")
            .to_number<double>() == 2250.0);
  // No temporary file left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(dir.path)) ++files;
  CHECK(files == 1);

  {
    std::ofstream out(c);
    out << "{\"entries\": [{\"program\": 1}]}";
  }
  const std::string w = what_of([&] { cached_limit(c, a); });
  CHECK(w.find("profile cache " + c.string()) != std::string::npos);
  CHECK(w.find("entry 1: \"program\"") != std::string::npos);
  // A bad file is not overwritten.
  CHECK_THROWS_AS(store_limit(c, a, 500, {}), gpurun::Error);
  CHECK(slurp(c) == "{\"entries\": [{\"program\": 1}]}");
  {
    std::ofstream out(c);
    out << "not json";
  }
  CHECK(what_of([&] { cached_limit(c, a); }).find("not JSON") != std::string::npos);
}

TEST_CASE("ProfileRow::to_json_fields has the fields of power_profile") {
  ProfileRow r{450, 40, 4.0, 1800.0, 10.0, 450.0, 62.5, 7.5, 71.0, Cooldown::kTimeout};
  const auto o = boost::json::parse(r.to_json_fields()).as_object();
  CHECK(o.size() == 10);
  CHECK(o.at("warmup_s").to_number<double>() == 7.5);
  CHECK(o.at("temp_c").to_number<double>() == 71.0);
  CHECK(o.at("cooldown").as_string() == "timeout");
  CHECK(o.at("limit_w").to_number<int64_t>() == 450);
  CHECK(o.at("steps").to_number<int64_t>() == 40);
  CHECK(o.at("seconds").to_number<double>() == 4.0);
  CHECK(o.at("energy_j").to_number<double>() == 1800.0);
  CHECK(o.at("steps_per_s").to_number<double>() == 10.0);
  CHECK(o.at("avg_power_w").to_number<double>() == 450.0);
  CHECK(o.at("cost_per_step").to_number<double>() == 62.5);
}
