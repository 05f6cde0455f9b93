#include "energy/early_stop.hpp"

#include <doctest/doctest.h>

#include "gpurun_process.hpp"

#include <sys/stat.h>
#include <unistd.h>
#include <fstream>
#include <functional>
#include <string>

#include <boost/json.hpp>

#include "check_text.hpp"
#include "gpurun/error.hpp"

using namespace gpurun::energy;
namespace fs = std::filesystem;

namespace {

// A window of `seconds` on `active` at a constant 300 W per GPU, each GPU's max limit 700 W.
WindowRecord window(double t0, double seconds, std::vector<int> active,
                    std::optional<unsigned> limit, double eta = 0.5, double watts = 300) {
  WindowRecord w;
  w.kind = "steps";
  w.t0_s = t0;
  w.t1_s = t0 + seconds;
  w.active = active;
  for (int slot : active) w.gpus.push_back({slot, watts * seconds, watts * seconds, watts});
  w.energy_j = watts * seconds * active.size();
  w.max_power_w = 700.0 * active.size();
  w.eta = eta;
  w.cost = zeus_cost(w.energy_j, seconds, w.max_power_w, eta);
  w.power_limit_w = limit;
  return w;
}

// A fresh directory under the temp dir, removed at scope exit (the tests' shared one).
using gpurun::testing::TempDir;

using gpurun::testing::what_of;

}  // namespace

TEST_CASE("CostTracker: epoch sums, time-weighted means, and the predictor") {
  CostTracker t;
  // Epoch 1: profiling — 10 s on {0,1} with no single limit, then 10 s on {0,1} at 250 W.
  // Each window: E = 2·300·10 = 6000 J, cost = 0.5·6000 + 0.5·1400·10 = 3000 + 7000 = 10000 J.
  t.add_window(window(0, 10, {0, 1}, std::nullopt));
  t.add_window(window(10, 10, {0, 1}, 250u));
  const EpochRecord e1 = t.end_epoch(1);
  CHECK(e1.epoch == 1);
  CHECK(e1.seconds == doctest::Approx(20));
  CHECK(e1.energy_j == doctest::Approx(12000));
  CHECK(e1.gpu_energy_j.at(0) == doctest::Approx(6000));
  CHECK(e1.gpu_energy_j.at(1) == doctest::Approx(6000));
  CHECK(e1.active_gpus == doctest::Approx(2));
  CHECK(e1.max_power_w == doctest::Approx(1400));
  CHECK(e1.cost == doctest::Approx(20000));
  CHECK(e1.cost_total == doctest::Approx(20000));
  // Epoch 1 was mixed (limit changed inside it): the prediction is epoch 1 alone, 20000 J.
  CHECK(e1.predicted_next_cost == doctest::Approx(20000));

  // Epoch 2: shrunk to {0} at 250 W: one window of 10 s at 300 W:
  // E = 3000 J, cost = 0.5·3000 + 0.5·700·10 = 1500 + 3500 = 5000 J.
  t.add_window(window(20, 10, {0}, 250u));
  const EpochRecord e2 = t.end_epoch(2);
  CHECK(e2.cost == doctest::Approx(5000));
  CHECK(e2.cost_total == doctest::Approx(25000));
  CHECK(e2.active_gpus == doctest::Approx(1));
  CHECK(e2.max_power_w == doctest::Approx(700));
  CHECK(e2.gpu_energy_j.count(1) == 0);  // slot 1 not charged
  // Steady epoch whose configuration differs from epoch 1: its own cost, 5000 J (not the mean
  // 12500 J with the profiling epoch).
  CHECK(e2.predicted_next_cost == doctest::Approx(5000));

  // Epoch 3: same configuration, 20 s: E = 6000 J, cost = 3000 + 0.5·700·20 = 10000 J.
  t.add_window(window(30, 20, {0}, 250u));
  const EpochRecord e3 = t.end_epoch(3);
  CHECK(e3.cost == doctest::Approx(10000));
  CHECK(e3.cost_total == doctest::Approx(35000));
  // Trailing steady run = epochs 2 and 3: mean (5000 + 10000)/2 = 7500 J.
  CHECK(e3.predicted_next_cost == doctest::Approx(7500));
  CHECK(t.predicted_next_cost() == doctest::Approx(7500));
  CHECK(t.epochs().size() == 3);
  CHECK(t.epochs().back().predicted_next_cost == doctest::Approx(7500));

  // Epoch 4: grown back to {0,1} for 10 s then {0} for 30 s, both at 250 W: mixed.
  // Time-weighted active GPUs: (2·10 + 1·30)/40 = 1.25; max power (1400·10 + 700·30)/40 = 875 W.
  // Cost: 10000 + (0.5·9000 + 0.5·700·30 = 4500 + 10500 = 15000) = 25000 J.
  t.add_window(window(50, 10, {0, 1}, 250u));
  t.add_window(window(60, 30, {0}, 250u));
  const EpochRecord e4 = t.end_epoch(4);
  CHECK(e4.active_gpus == doctest::Approx(1.25));
  CHECK(e4.max_power_w == doctest::Approx(875));
  CHECK(e4.cost == doctest::Approx(25000));
  CHECK(e4.gpu_energy_j.at(1) == doctest::Approx(3000));
  CHECK(e4.predicted_next_cost == doctest::Approx(25000));  // mixed: the last epoch alone

  // Epoch 5, mixed again ({0,1} then {0}, 10 s each): 10000 + 5000 = 15000 J. Two mixed epochs
  // in a row are not averaged: the prediction is 15000 J (not (25000 + 15000)/2 = 20000 J).
  t.add_window(window(90, 10, {0, 1}, 250u));
  t.add_window(window(100, 10, {0}, 250u));
  const EpochRecord e5 = t.end_epoch(5);
  CHECK(e5.cost == doctest::Approx(15000));
  CHECK(e5.predicted_next_cost == doctest::Approx(15000));

  // Summary includes an open epoch's windows: +5 s on {0}: cost 0.5·1500 + 0.5·700·5 = 2500 J.
  t.add_window(window(110, 5, {0}, 250u));
  const CostSummary s = t.summary();
  CHECK(s.epochs == 5);
  CHECK(s.seconds == doctest::Approx(20 + 10 + 20 + 40 + 20 + 5));
  CHECK(s.cost == doctest::Approx(75000 + 2500));
  // Slot 0: 6000 + 3000 + 6000 + 12000 + 6000 + 1500 = 34500 J;
  // slot 1: 6000 + 3000 + 3000 = 12000 J.
  CHECK(s.gpu_energy_j.at(0) == doctest::Approx(34500));
  CHECK(s.gpu_energy_j.at(1) == doctest::Approx(12000));
  CHECK(t.cost_total() == doctest::Approx(75000));  // finished epochs only
}

TEST_CASE(
    "stop_reason: never before the first epoch, then exactly when total + predicted > threshold") {
  CostTracker t;
  CHECK_FALSE(t.stop_reason(0.0).has_value());   // nothing finished yet, even at threshold 0
  CHECK_FALSE(t.stop_reason(-1.0).has_value());  // … or below any cost
  t.add_window(window(0, 10, {0}, 250u));        // cost 0.5·3000 + 0.5·700·10 = 5000 J
  CHECK_FALSE(t.stop_reason(0.0).has_value());   // the epoch is still open
  t.end_epoch(1);
  t.add_window(window(10, 10, {0}, 250u));
  t.end_epoch(2);
  // cost_total = 10000 J, predicted = mean(5000, 5000) = 5000 J, sum 15000 J.
  CHECK_FALSE(t.stop_reason(15000.0).has_value());  // equal: not passed
  CHECK_FALSE(t.stop_reason(15000.5).has_value());
  const auto r = t.stop_reason(14999.5);
  REQUIRE(r.has_value());
  // Epochs counted from 1 as on the console: after epochs 1 and 2 (from 0) comes the 4th.
  CHECK(*r ==
        "the predicted total cost after epoch 4 (15000.0 J) would pass the threshold (14999.5 J): "
        "10000.0 J so far + 5000.0 J predicted for the next epoch");
  // With β from the history: 2.0 × best 7000.0 J = 14000 J < 15000 J.
  const auto th = threshold_from(std::nullopt, 2.0, 7000.0, "history.jsonl");
  REQUIRE(th.has_value());
  const auto r2 = t.stop_reason(*th);
  REQUIRE(r2.has_value());
  CHECK(r2->find("after epoch 4 (15000.0 J) would pass the threshold (14000.0 J = 2.0 × best "
                 "7000.0 J from history.jsonl)") != std::string::npos);
}

TEST_CASE("threshold_from: absolute wins, else factor × best, else none") {
  auto a = threshold_from(1000.0, 2.0, 300.0);
  REQUIRE(a.has_value());
  CHECK(a->cost_j == 1000.0);
  CHECK(a->origin.empty());
  auto b = threshold_from(std::nullopt, 2.0, 500.0, "h.jsonl");
  REQUIRE(b.has_value());
  CHECK(b->cost_j == doctest::Approx(1000.0));  // 2 · 500
  CHECK(b->origin == "2.0 × best 500.0 J from h.jsonl");
  auto c = threshold_from(std::nullopt, 1.25, 400.0, "h.jsonl");
  REQUIRE(c.has_value());
  CHECK(c->cost_j == doctest::Approx(500.0));  // 1.25 · 400
  CHECK(c->origin == "1.25 × best 400.0 J from h.jsonl");
  CHECK_FALSE(threshold_from(std::nullopt, 2.0, std::nullopt).has_value());  // no history yet
  CHECK_FALSE(threshold_from(std::nullopt, 0.0, 500.0).has_value());         // β off
}

TEST_CASE("history: append, best over completed runs of one job, bad lines named file:line") {
  TempDir dir;
  const fs::path h = dir.path / "history.jsonl";
  CHECK_FALSE(best_cost(h, "vit").has_value());  // no file yet
  append_history(h, {"vit", 900, 1800, 100, 3, true});
  append_history(h, {"vit", 700, 1400, 90, 2, false});  // stopped early: not a candidate
  append_history(h, {"cnn", 100, 200, 10, 1, true});
  append_history(h, {"vit", 800, 1600, 95, 3, true});
  CHECK(best_cost(h, "vit") == 800.0);  // min(900, 800); 700 was not completed
  CHECK(best_cost(h, "cnn") == 100.0);
  CHECK_FALSE(best_cost(h, "other").has_value());
  {
    std::ifstream in(h);
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      ++lines;
      if (lines == 2) {
        const auto o = boost::json::parse(line).as_object();
        CHECK(o.at("job").as_string() == "vit");
        CHECK(o.at("epochs").to_number<int64_t>() == 2);
        CHECK(o.at("completed").as_bool() == false);
        CHECK(o.at("energy_j").to_number<double>() == 1400.0);
      }
    }
    CHECK(lines == 4);
  }

  const fs::path bad = dir.path / "bad.jsonl";
  {
    std::ofstream out(bad);
    out << "{\"job\": \"vit\", \"cost\": 5, \"completed\": true}\n\n{not json\n";
  }
  // Line 3 (line 2 is blank and skipped).
  CHECK(what_of([&] { best_cost(bad, "vit"); }).find(bad.string() + ":3: not a JSON line") !=
        std::string::npos);
  {
    std::ofstream out(bad);
    out << "{\"job\": \"vit\", \"cost\": \"cheap\", \"completed\": true}\n";
  }
  CHECK(what_of([&] { best_cost(bad, "vit"); }).find(bad.string() + ":1: \"cost\"") !=
        std::string::npos);

  CHECK(what_of([&] {
          append_history(dir.path / "no" / "such" / "dir.jsonl", {"x", 1, 1, 1, 1, true});
        }).find("cannot open the energy history") != std::string::npos);
}

TEST_CASE(
    "history: a file over the size limit, a device or a FIFO is refused by name, key and "
    "limit, without reading it") {
  TempDir dir;
  // Sparse: one byte over the limit costs no disk. (Read line by line it is one 16 MiB line.)
  const fs::path big = dir.path / "big.jsonl";
  {
    std::ofstream(big).put('\n');
    fs::resize_file(big, kMaxHistoryBytes + 1);
  }
  const std::string too_big = what_of([&] { best_cost(big, "vit"); });
  REQUIRE_MESSAGE(
      too_big.find("is 16777217 bytes, more than the limit of 16 MiB") != std::string::npos,
      too_big);
  CHECK(too_big.find(big.string() + " ([energy] history)") != std::string::npos);
  // Exactly the limit is still read (here: blank lines only, so no best cost).
  std::ofstream(big, std::ios::trunc) << std::string(kMaxHistoryBytes, '\n');
  CHECK_FALSE(best_cost(big, "vit").has_value());

  // /dev/zero never ends: read by line it took 16.8 GB of memory.
  const std::string dev = what_of([&] { best_cost("/dev/zero", "vit"); });
  CHECK_MESSAGE(dev.find("the energy history /dev/zero ([energy] history) cannot be read: it is "
                         "a character device, not a regular file") != std::string::npos,
                dev);
  const std::string dir_msg = what_of([&] { best_cost(dir.path, "vit"); });
  CHECK(dir_msg.find("it is a directory, not a regular file") != std::string::npos);

  // A FIFO with no writer (or reader) would block the open: neither read nor written.
  const fs::path fifo = dir.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(what_of([&] { best_cost(fifo, "vit"); }).find("it is a FIFO, not a regular file") !=
        std::string::npos);
  CHECK(what_of([&] {
          append_history(fifo, {"x", 1, 1, 1, 1, true});
        }).find("cannot open the energy history") != std::string::npos);
  CHECK(what_of([&] {
          append_history("/dev/null", {"x", 1, 1, 1, 1, true});
        }).find("is not a regular file but a character device") != std::string::npos);
}

TEST_CASE(
    "format_joules: fixed below 1e12 J, six significant digits above (1e308: not 309 digits)") {
  CHECK(format_joules(1234.56) == "1234.6");
  CHECK(format_joules(1234.56, 0) == "1235");
  CHECK(format_joules(1e308, 0) == "1e+308");
  CHECK(format_joules(1e308) == "1e+308");
  CHECK(format_joules(123456789012345.0) == "1.23457e+14");
  // The threshold's origin uses it (as do the stop sentence and the monitor's start line).
  CHECK(threshold_from(std::nullopt, 2.0, 1e300)->origin == "2.0 × best 1e+300 J from history");
}

TEST_CASE("EpochRecord::to_json_fields has the fields of energy_epoch") {
  CostTracker t;
  t.add_window(window(0, 10, {0, 3}, 250u));
  const EpochRecord e = t.end_epoch(7);
  auto o = boost::json::parse(e.to_json_fields(12345.0)).as_object();
  CHECK(o.size() == 10);
  CHECK(o.at("epoch").to_number<int64_t>() == 7);
  CHECK(o.at("gpu_energy_j").as_object().at("3").to_number<double>() == doctest::Approx(3000));
  CHECK(o.at("cost").to_number<double>() == doctest::Approx(0.5 * 6000 + 0.5 * 1400 * 10));
  CHECK(o.at("threshold").to_number<double>() == 12345.0);
  for (const char* k :
       {"seconds", "energy_j", "active_gpus", "max_power_w", "cost_total", "predicted_next_cost"}) {
    CHECK_MESSAGE(o.contains(k), k);
  }
  o = boost::json::parse(e.to_json_fields(std::nullopt)).as_object();
  CHECK(o.at("threshold").is_null());
}

TEST_CASE("cost tracker: an epoch abandoned at a restart counts in the totals, not as an epoch") {
  CostTracker t;
  // Epoch 0 of attempt 0: 10 s on one GPU at 300 W: E = 3000 J, cost = 0.5·3000 + 0.5·700·10
  // = 5000 J. Then 4 s of epoch 1 before a crash: E = 1200 J, cost = 600 + 1400 = 2000 J.
  t.add_window(window(0, 10, {0}, std::nullopt));
  CHECK(t.end_epoch(0).cost == doctest::Approx(5000));
  t.add_window(window(10, 4, {0}, std::nullopt));
  t.abandon_epoch();
  CHECK(t.epochs().size() == 1);
  CHECK(t.cost_total() == doctest::Approx(7000));  // spent: it counts towards a threshold
  // The restarted attempt's epoch 0 (10 s): its own cost, the total keeps the crash.
  t.add_window(window(14, 10, {0}, std::nullopt));
  const EpochRecord e = t.end_epoch(0);
  CHECK(e.cost == doctest::Approx(5000));
  CHECK(e.seconds == doctest::Approx(10));
  CHECK(e.cost_total == doctest::Approx(12000));
  const CostSummary s = t.summary();
  CHECK(s.epochs == 2);
  CHECK(s.seconds == doctest::Approx(24));
  CHECK(s.energy_j == doctest::Approx(7200));
  CHECK(s.cost == doctest::Approx(12000));
}
