// ScaleProfiler (`[energy] scale = "auto"`): table-driven against a model job whose epoch time
// on n GPUs is T(n) = max(floor, work / n) (the speed-up per GPU falls off: no gain past
// work / floor GPUs) and whose GPUs each draw P W, so E(n) = n·P·T(n). The expected choice is
// the argmin of Zeus' cost of that model, computed here.
#include "energy/scale_profiler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "check_text.hpp"
#include "energy/cost.hpp"
#include "gpurun/error.hpp"

using namespace gpurun::energy;
using gpurun::testing::contains;

namespace {

struct Model {
  double work_s = 8, floor_s = 2, power_w = 600;
  double seconds(int n) const { return std::max(floor_s, work_s / n); }
  double energy(int n) const { return n * power_w * seconds(n); }
};

ScaleOptions options(int gpus, double eta = 0.5) {
  ScaleOptions o;
  for (int i = 0; i < gpus; ++i) o.allowed.push_back(i);
  o.eta = eta;
  o.max_power_w = 700.0 * gpus;
  return o;
}

/// The model's argmin of cost per epoch over 1..gpus (ties: fewer GPUs).
int expected_choice(const Model& m, const ScaleOptions& o) {
  int best = 1;
  double best_cost = 1e300;
  for (int n = 1; n <= static_cast<int>(o.allowed.size()); ++n) {
    const double c = zeus_cost(m.energy(n), m.seconds(n), o.max_power_w, o.eta);
    if (c < best_cost) best = n, best_cost = c;
  }
  return best;
}

/// Runs epochs of the model: each epoch after a count change is mixed (the resize inside it),
/// the others steady on p.gpus(). Returns the counts trained on, per epoch.
std::vector<int> drive(ScaleProfiler& p, const Model& m, int epochs) {
  std::vector<int> counts;
  bool changed = false;
  for (int e = 0; e < epochs; ++e) {
    const int n = p.count();
    counts.push_back(n);
    const std::optional<std::vector<int>> steady =
        changed ? std::nullopt : std::optional<std::vector<int>>(p.gpus());
    changed = p.on_epoch(e, steady, m.seconds(n), m.energy(n));
  }
  return counts;
}

}  // namespace

TEST_CASE("scale: the search descends from every GPU and chooses the model's cheapest count") {
  struct Case {
    int gpus;
    double eta, work_s, floor_s;
  };
  for (const Case& c : {Case{4, 0.5, 8, 4},     // no gain past 2 GPUs: 2
                        Case{4, 0.5, 8, 2},     // linear to 4: time dominates at η = 0.5
                        Case{4, 1.0, 8, 2},     // energy only, equal at every count: 1
                        Case{8, 0.5, 16, 5},    // plateau at 3.2 GPUs
                        Case{4, 0.0, 8, 8},     // time only, no speed-up at all: 1
                        Case{1, 0.5, 8, 2}}) {  // one GPU: nothing to try
    CAPTURE(c.gpus);
    CAPTURE(c.eta);
    CAPTURE(c.floor_s);
    Model m;
    m.work_s = c.work_s;
    m.floor_s = c.floor_s;
    ScaleProfiler p(options(c.gpus, c.eta));
    CHECK(p.count() == c.gpus);
    drive(p, m, 4 * c.gpus + 4);
    REQUIRE(p.chosen());
    CHECK(p.choice() == expected_choice(m, options(c.gpus, c.eta)));
    CHECK(p.count() == p.choice());
    CHECK(p.gpus().size() == static_cast<size_t>(p.choice()));
    CHECK(p.out().size() == static_cast<size_t>(c.gpus - p.choice()));
    // Rows: measured from the top down, each at the model's own figures.
    const auto& rows = p.rows();
    REQUIRE(!rows.empty());
    for (size_t i = 0; i < rows.size(); ++i) {
      CHECK(rows[i].gpus == c.gpus - static_cast<int>(i));
      CHECK(rows[i].seconds == doctest::Approx(m.seconds(rows[i].gpus)));
      CHECK(rows[i].energy_j == doctest::Approx(m.energy(rows[i].gpus)));
    }
    CHECK(contains(p.phase_text(), "chose " + std::to_string(p.choice()) + " of"));
  }
}

TEST_CASE("scale: the descent stops at the first rise; each count pays one warm-up epoch") {
  Model m;  // T = max(4, 8/n): 1 GPU 8 s, 2..4 GPUs 4 s
  m.floor_s = 4;
  ScaleProfiler p(options(4));
  const std::vector<int> counts = drive(p, m, 12);
  // 4: steady warm-up, measured; 3: mixed warm-up, measured; 2 likewise; 1 likewise (the rise);
  // then 2, the choice.
  CHECK(counts == std::vector<int>{4, 4, 3, 3, 2, 2, 1, 1, 2, 2, 2, 2});
  REQUIRE(p.rows().size() == 4);
  CHECK(p.rows().back().gpus == 1);
  CHECK(p.rows().back().cost > p.rows()[2].cost);
  CHECK(p.choice() == 2);
  int finished = 0;
  while (p.take_finished_row()) ++finished;
  CHECK(finished == 4);
  CHECK(p.take_new_choice());
  CHECK(!p.take_new_choice());  // once
}

TEST_CASE("scale: an epoch on another set counts for nothing; a mixed one restarts the warm-up") {
  Model m;
  ScaleProfiler p(options(3));
  CHECK(!p.on_epoch(0, std::vector<int>{0, 1, 2}, 4, 100));  // warm-up
  // A lease took GPU 2 for an epoch: not a measurement of 3 GPUs.
  CHECK(!p.on_epoch(1, std::vector<int>{0, 1}, 4, 100));
  CHECK(p.rows().empty());
  CHECK(!p.on_epoch(2, std::nullopt, 4, 100));  // it came back inside this one: warm-up again
  CHECK(p.rows().empty());
  CHECK(p.on_epoch(3, std::vector<int>{0, 1, 2}, 4, 100));  // measured: on to 2
  REQUIRE(p.rows().size() == 1);
  CHECK(p.rows()[0].last_epoch == 3);
  CHECK(p.count() == 2);
  CHECK(contains(p.phase_text(), "measuring 2 of 3 GPUs"));
}

TEST_CASE("scale: a re-check searches again from one GPU above the choice") {
  Model m;  // the cheapest count is 2 at first ...
  m.floor_s = 4;
  ScaleOptions o = options(4);
  o.recheck_epochs = 3;
  ScaleProfiler p(o);
  drive(p, m, 8);
  REQUIRE(p.chosen());
  REQUIRE(p.choice() == 2);
  // ... then 3 GPUs get faster (the floor drops): the re-check finds it.
  m.floor_s = 2;
  const std::vector<int> counts = drive(p, m, 10);
  CHECK(counts.front() == 2);
  CHECK(std::find(counts.begin(), counts.end(), 3) != counts.end());
  REQUIRE(p.chosen());
  CHECK(p.choice() == 3);
  CHECK(p.rows().front().gpus == 3);  // the re-check's rows only
}

TEST_CASE("scale: settings out of range are refused, naming the key") {
  ScaleOptions o = options(2);
  o.allowed.clear();
  CHECK_THROWS_WITH_AS(ScaleProfiler{o}, doctest::Contains("no GPU"), gpurun::Error);
  o = options(2);
  o.measure_epochs = 0;
  CHECK_THROWS_WITH_AS(ScaleProfiler{o}, doctest::Contains("scale_measure_epochs"), gpurun::Error);
  o = options(2);
  o.warmup_epochs = -1;
  CHECK_THROWS_WITH_AS(ScaleProfiler{o}, doctest::Contains("scale_warmup_epochs"), gpurun::Error);
  o = options(2);
  o.max_power_w = 0;
  CHECK_THROWS_AS(ScaleProfiler{o}, gpurun::Error);
}

TEST_CASE("scale: min_count ([policy] min_gpus) ends the descent there; the choice is above it") {
  Model m;  // the cheapest count is 2 (floor 4 s: 2..4 GPUs equally fast)
  m.floor_s = 4;
  ScaleOptions o = options(4);
  o.min_count = 3;
  ScaleProfiler p(o);
  const std::vector<int> counts = drive(p, m, 8);
  // Before: 4, 3, then 2 (below the floor): the job is kept at 3 and the search never ends.
  CHECK(counts == std::vector<int>{4, 4, 3, 3, 3, 3, 3, 3});
  REQUIRE(p.chosen());
  CHECK(p.choice() == 3);
  REQUIRE(p.rows().size() == 2);
  CHECK(contains(p.phase_text(), "(not below 3: [policy] min_gpus)"));
  o.min_count = 5;
  CHECK_THROWS_WITH_AS(ScaleProfiler{o}, doctest::Contains("outside [1, 4]"), gpurun::Error);
}

TEST_CASE("scale: a min_gpus reloaded above the count chooses among the rows at or above it") {
  Model m;
  m.floor_s = 4;
  {  // searching at 2 (4 and 3 measured): a floor of 3 chooses among 4 and 3 at once
    ScaleProfiler p(options(4));
    drive(p, m, 4);
    REQUIRE(p.count() == 2);
    REQUIRE(p.rows().size() == 2);
    CHECK(p.set_min_count(3));
    CHECK(p.chosen());
    CHECK(p.choice() == 3);  // equal cost: fewer GPUs
    CHECK(p.count() == 3);
    CHECK_FALSE(p.set_min_count(3));
  }
  {  // chosen 2: a floor of 3 measures 3 again (a new search at the floor)
    ScaleProfiler p(options(4));
    drive(p, m, 10);
    REQUIRE(p.chosen());
    REQUIRE(p.choice() == 2);
    CHECK(p.set_min_count(3));
    CHECK_FALSE(p.chosen());
    CHECK(p.count() == 3);
    CHECK(p.rows().empty());
    drive(p, m, 4);
    CHECK(p.chosen());
    CHECK(p.choice() == 3);
    CHECK(p.set_min_count(9) == true);  // clamped to the 4 allowed GPUs: measures 4
    CHECK(p.count() == 4);
  }
}

TEST_CASE(
    "scale: the plan leaves declared GPUs outside allowed_gpus out and refuses a floor "
    "above the allowed GPUs") {
  // Before: allowed [0, 1] of a declared [0, 1, 2, 3] gave nothing back beyond the count, so
  // the job trained on 4 GPUs while the search waited for epochs on [0, 1]: never measured.
  ScalePlan plan = plan_scale({0, 1, 2, 3}, std::vector<int>{1, 0}, 0);
  CHECK(plan.refused.empty());
  CHECK(plan.allowed == std::vector<int>{0, 1});
  CHECK(plan.outside == std::vector<int>{2, 3});
  CHECK(plan.min_count == 1);
  CHECK(plan.warnings.empty());
  plan = plan_scale({0, 1, 2}, std::nullopt, 2);
  CHECK(plan.allowed == std::vector<int>{0, 1, 2});
  CHECK(plan.outside.empty());
  CHECK(plan.min_count == 2);
  plan = plan_scale({0, 1, 2}, std::vector<int>{2, 5}, 0);
  CHECK(plan.allowed == std::vector<int>{2});
  CHECK(plan.outside == std::vector<int>{0, 1});
  REQUIRE(plan.warnings.size() == 1);
  CHECK(contains(plan.warnings[0], "allowed_gpus names GPU 5, which active_gpus ([0, 1, 2])"));
  plan = plan_scale({0, 1, 2}, std::vector<int>{1}, 0);  // one GPU: nothing to search
  CHECK(plan.refused ==
        "[energy] scale = \"auto\" has one GPU to choose among ([1]): nothing to "
        "search");
  plan = plan_scale({0, 1}, std::vector<int>{5}, 0);
  CHECK(contains(plan.refused, "no GPU to choose among"));
  plan = plan_scale({0, 1, 2, 3}, std::vector<int>{0, 1}, 3);
  CHECK(plan.refused ==
        "[energy] scale = \"auto\" cannot search: [policy] min_gpus = 3 is more than the 2 "
        "allowed GPUs ([0, 1])");
}
