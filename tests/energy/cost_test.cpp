#include "energy/cost.hpp"

#include <doctest/doctest.h>

#include <set>
#include <string>

#include <boost/json.hpp>

#include "gpurun/error.hpp"

using namespace gpurun::energy;

namespace {

// A GPU drawing a constant `w` watts from t=0 to t=10 s, sampled every 100 ms.
EnergySeries constant_power(double w) {
  EnergySeries s;
  for (int i = 0; i <= 100; ++i) s.add({0.1 * i, w * 0.1 * i, w});
  return s;
}

}  // namespace

TEST_CASE("zeus_cost is eta·E + (1 − eta)·MaxPower·T") {
  // E = 5000 J, T = 10 s, MaxPower = 1400 W, η = 0.5: 0.5·5000 + 0.5·1400·10 = 9500 J.
  CHECK(zeus_cost(5000, 10, 1400, 0.5) == doctest::Approx(9500));
  // η = 1: energy only, 5000 J. η = 0: time only, 1400·10 = 14000 J.
  CHECK(zeus_cost(5000, 10, 1400, 1.0) == doctest::Approx(5000));
  CHECK(zeus_cost(5000, 10, 1400, 0.0) == doctest::Approx(14000));
  // η = 0.25: 0.25·5000 + 0.75·14000 = 1250 + 10500 = 11750 J.
  CHECK(zeus_cost(5000, 10, 1400, 0.25) == doctest::Approx(11750));
  CHECK_THROWS_AS(zeus_cost(5000, 10, 1400, 1.5), gpurun::InvariantError);
  CHECK_THROWS_AS(zeus_cost(5000, 10, 1400, -0.1), gpurun::InvariantError);
}

TEST_CASE("account_window: two GPUs at 300 W and 200 W for 10 s") {
  const EnergySeries g0 = constant_power(300), g1 = constant_power(200);
  const std::map<int, const EnergySeries*> series{{0, &g0}, {1, &g1}};
  const std::map<int, double> max_limit{{0, 700}, {1, 700}};
  const WindowRecord r =
      account_window("epoch", 3, 1, 469, 0.0, 10.0, {1, 0}, series, max_limit, 0.5, 250u);
  // E = 300·10 + 200·10 = 5000 J; MaxPower = 700 + 700 = 1400 W;
  // cost = 0.5·5000 + 0.5·1400·10 = 9500 J; average power 5000/10 = 500 W.
  CHECK(r.seconds() == doctest::Approx(10));
  CHECK(r.energy_j == doctest::Approx(5000));
  CHECK(r.max_power_w == doctest::Approx(1400));
  CHECK(r.cost == doctest::Approx(9500));
  CHECK(r.avg_power_w == doctest::Approx(500));
  REQUIRE(r.gpus.size() == 2);
  CHECK(r.active == std::vector<int>{0, 1});  // sorted
  CHECK(r.gpus[0].slot == 0);
  CHECK(r.gpus[0].energy_j == doctest::Approx(3000));
  CHECK(r.gpus[0].power_integral_j == doctest::Approx(3000));
  CHECK(r.gpus[0].avg_power_w == doctest::Approx(300));
  CHECK(r.gpus[1].slot == 1);
  CHECK(r.gpus[1].energy_j == doctest::Approx(2000));
  CHECK(r.gpus[1].avg_power_w == doctest::Approx(200));
  CHECK(r.kind == "epoch");
  CHECK(r.generation == 3);
  CHECK(r.epoch == 1);
  CHECK(r.step == 469);
  CHECK(r.power_limit_w == 250u);
}

TEST_CASE("account_window across a shrink: GPUs not active are not charged") {
  const EnergySeries g0 = constant_power(300), g1 = constant_power(200), g2 = constant_power(250);
  const std::map<int, const EnergySeries*> series{{0, &g0}, {1, &g1}, {2, &g2}};
  // Different maximum limits per GPU, so MaxPower shows which GPUs were counted.
  const std::map<int, double> max_limit{{0, 700}, {1, 500}, {2, 400}};
  // Slot 2 was parked (still drawing 250 W, e.g. held in place): only 0 and 1 are charged.
  // E = 3000 + 2000 = 5000 J, MaxPower = 700 + 500 = 1200 W (not 1600),
  // cost = 0.5·5000 + 0.5·1200·10 = 2500 + 6000 = 8500 J.
  const WindowRecord shrunk =
      account_window("steps", 2, 1, 500, 0.0, 10.0, {0, 1}, series, max_limit, 0.5);
  CHECK(shrunk.energy_j == doctest::Approx(5000));
  CHECK(shrunk.max_power_w == doctest::Approx(1200));
  CHECK(shrunk.cost == doctest::Approx(8500));
  CHECK(shrunk.gpus.size() == 2);
  CHECK_FALSE(shrunk.power_limit_w.has_value());
  // The same window with all three active: E = 7500 J, MaxPower = 1600 W,
  // cost = 0.5·7500 + 0.5·1600·10 = 3750 + 8000 = 11750 J.
  const WindowRecord all =
      account_window("steps", 1, 1, 500, 0.0, 10.0, {0, 1, 2}, series, max_limit, 0.5);
  CHECK(all.energy_j == doctest::Approx(7500));
  CHECK(all.max_power_w == doctest::Approx(1600));
  CHECK(all.cost == doctest::Approx(11750));
  // Only slots 0 and 2 (1 left): E = 3000 + 2500 = 5500 J, MaxPower = 1100 W,
  // cost = 2750 + 5500 = 8250 J.
  const WindowRecord other =
      account_window("steps", 3, 1, 500, 0.0, 10.0, {2, 0}, series, max_limit, 0.5);
  CHECK(other.energy_j == doctest::Approx(5500));
  CHECK(other.max_power_w == doctest::Approx(1100));
  CHECK(other.cost == doctest::Approx(8250));
  // Paused (no active GPU): nothing charged, zero cost, whatever the GPUs drew.
  const WindowRecord paused =
      account_window("time", 4, -1, -1, 0.0, 10.0, {}, series, max_limit, 0.5);
  CHECK(paused.energy_j == 0.0);
  CHECK(paused.max_power_w == 0.0);
  CHECK(paused.cost == 0.0);
  CHECK(paused.gpus.empty());
}

TEST_CASE("account_window with edges between samples") {
  const EnergySeries g0 = constant_power(300), g1 = constant_power(200);
  const std::map<int, const EnergySeries*> series{{0, &g0}, {1, &g1}};
  const std::map<int, double> max_limit{{0, 700}, {1, 700}};
  // [2.55, 7.55]: 5 s, edges in the middle of 100 ms steps. E = 300·5 + 200·5 = 2500 J,
  // cost = 0.5·2500 + 0.5·1400·5 = 1250 + 3500 = 4750 J.
  const WindowRecord r =
      account_window("time", 1, -1, -1, 2.55, 7.55, {0, 1}, series, max_limit, 0.5);
  CHECK(r.energy_j == doctest::Approx(2500));
  CHECK(r.cost == doctest::Approx(4750));
  // η = 0.8 on the same window: 0.8·2500 + 0.2·1400·5 = 2000 + 1400 = 3400 J.
  const WindowRecord r8 =
      account_window("time", 1, -1, -1, 2.55, 7.55, {0, 1}, series, max_limit, 0.8);
  CHECK(r8.cost == doctest::Approx(3400));
  CHECK(r8.eta == doctest::Approx(0.8));
}

TEST_CASE("account_window rejects an active slot without a series or a max limit") {
  const EnergySeries g0 = constant_power(300);
  const std::map<int, const EnergySeries*> series{{0, &g0}};
  CHECK_THROWS_AS(
      account_window("time", 1, -1, -1, 0, 10, {0, 1}, series, {{0, 700}, {1, 700}}, 0.5),
      gpurun::InvariantError);
  CHECK_THROWS_AS(account_window("time", 1, -1, -1, 0, 10, {0}, series, {}, 0.5),
                  gpurun::InvariantError);
  CHECK_THROWS_AS(account_window("time", 1, -1, -1, 10, 0, {0}, series, {{0, 700}}, 0.5),
                  gpurun::InvariantError);
}

TEST_CASE("to_json_fields has exactly the fields of the energy event") {
  const EnergySeries g0 = constant_power(300), g1 = constant_power(200);
  const std::map<int, const EnergySeries*> series{{0, &g0}, {1, &g1}};
  const std::map<int, double> max_limit{{0, 700}, {1, 700}};
  WindowRecord r = account_window("epoch", 3, 1, 469, 0.0, 10.0, {0, 1}, series, max_limit, 0.5);
  r.t0_s = 1712345678.25;  // Unix time survives the round trip
  r.t1_s = 1712345688.25;
  boost::json::object o = boost::json::parse(r.to_json_fields()).as_object();
  std::set<std::string> keys;
  for (const auto& kv : o) keys.insert(std::string(kv.key()));
  // docs/energy.md#events, `energy`.
  CHECK(keys == std::set<std::string>{"kind", "generation", "epoch", "step", "t0", "t1", "seconds",
                                      "active", "gpus", "energy_j", "avg_power_w", "max_power_w",
                                      "eta", "cost", "power_limit_w"});
  CHECK(o.at("kind").as_string() == "epoch");
  CHECK(o.at("generation").to_number<int64_t>() == 3);
  CHECK(o.at("step").to_number<int64_t>() == 469);
  CHECK(o.at("t0").to_number<double>() == 1712345678.25);
  CHECK(o.at("seconds").to_number<double>() == doctest::Approx(10));
  CHECK(o.at("cost").to_number<double>() == doctest::Approx(9500));
  CHECK(o.at("max_power_w").to_number<double>() == doctest::Approx(1400));
  CHECK(o.at("power_limit_w").is_null());
  CHECK(o.at("active").as_array().size() == 2);
  const auto& g = o.at("gpus").as_array().at(1).as_object();
  CHECK(g.at("slot").to_number<int64_t>() == 1);
  CHECK(g.at("energy_j").to_number<double>() == doctest::Approx(2000));
  CHECK(g.at("power_integral_j").to_number<double>() == doctest::Approx(2000));
  CHECK(g.at("avg_power_w").to_number<double>() == doctest::Approx(200));

  r.power_limit_w = 250;
  o = boost::json::parse(r.to_json_fields()).as_object();
  CHECK(o.at("power_limit_w").to_number<int64_t>() == 250);
}
