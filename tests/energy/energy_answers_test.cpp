// EnergyAnswers (energy/energy_answers.hpp): the program's energy questions answered through
// the store, on a FakeClock and a fake monitor whose readings the test moves.
#include "energy/energy_answers.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "gpurun/clock.hpp"
#include "gpurun/control/keys.hpp"
#include "testing/memory_store.hpp"

namespace {

namespace json = boost::json;
namespace keys = gpurun::control::keys;
using gpurun::control::EnergyQuestion;
using gpurun::energy::EnergyAnswers;
using gpurun::energy::EpochRecord;
using namespace std::chrono_literals;

// Two GPUs drawing 300 W (slot 0) and 200 W (slot 1) since Unix time 0: counter(t) = W · t.
// They have been read up to `read_until`.
struct FakeMonitor final : gpurun::energy::EnergyReader {
  double read_until = 0;
  std::vector<EpochRecord> recs;
  std::optional<std::map<int, double>> counters_at(double t) const override {
    if (t > read_until) return std::nullopt;
    return std::map<int, double>{{0, 300 * t}, {1, 200 * t}};
  }
  std::vector<int> active() const override { return {0, 1}; }
  std::map<int, std::pair<double, double>> job_and_epoch_j() const override {
    return {{0, {1000.5, 250.25}}, {1, {800, 200}}};
  }
  const std::vector<EpochRecord>& epochs() const override { return recs; }
  std::optional<double> threshold_j() const override { return 5000; }
};

struct Fixture {
  gpurun::FakeClock clock;
  gpurun::store::testing::MemoryStore store;
  gpurun::supervisor::EventLog events;
  std::vector<std::string> records;  // the event log's records
  FakeMonitor* monitor = nullptr;
  std::string stop;
  std::unique_ptr<EnergyAnswers> answers;

  Fixture() {
    events.set_observer([this](std::string_view, const std::string& r) { records.push_back(r); });
    gpurun::energy::AnswerOptions o;
    o.job_start_s = clock.unix_seconds() - 60;
    answers = std::make_unique<EnergyAnswers>(
        store, clock, events, [this] { return stop; }, o);
    auto m = std::make_unique<FakeMonitor>();
    monitor = m.get();
    monitor->read_until = clock.unix_seconds();
    answers->set_reader(std::move(m));
  }
  // The worker of `slot` (pid 4242) asks its n-th question; true when the answers took it.
  bool ask(int slot, int64_t n, EnergyQuestion q) {
    const std::string key = keys::energy_ask(slot, 4242, n);
    store.set(key, q.to_json());
    return answers->on_key(key);
  }
  std::optional<json::object> answer(int slot, int64_t n) {
    const auto v = store.try_get(keys::energy_answer(slot, 4242, n));
    if (!v) return std::nullopt;
    return json::parse(*v).as_object();
  }
  static EnergyQuestion window(EnergyQuestion::Op op, double t, int rank = 0) {
    EnergyQuestion q;
    q.op = op;
    q.name = "eval";
    q.rank = rank;
    q.t_s = t;
    return q;
  }
};

double num(const json::value& v) {
  return v.to_number<double>();
}

}  // namespace

TEST_CASE("rt.energy(): the job's and the epoch's joules per GPU and every finished epoch") {
  Fixture f;
  EpochRecord e;
  e.epoch = 0;
  e.seconds = 2.5;
  e.energy_j = 1234.5;
  e.gpu_energy_j = {{0, 700}, {1, 534.5}};
  f.monitor->recs.push_back(e);
  REQUIRE(f.ask(0, 0, EnergyQuestion{}));
  CHECK_FALSE(f.store.try_get(keys::energy_ask(0, 4242, 0)));  // read and deleted
  const auto a = f.answer(0, 0);
  REQUIRE(a);
  CHECK(num(a->at("job_j")) == 1800.5);
  CHECK(num(a->at("epoch_j")) == 450.25);
  CHECK(num(a->at("seconds")) == doctest::Approx(60));
  CHECK(a->at("epoch").as_int64() == 1);
  const auto& gpus = a->at("gpus").as_array();
  REQUIRE(gpus.size() == 2);
  CHECK(num(gpus[1].at("job_j")) == 800);
  // The epoch's record is the energy_epoch event's, to the digit.
  CHECK(json::serialize(a->at("epochs").as_array()[0]) ==
        json::serialize(json::parse(e.to_json_fields(5000.0))));
}

TEST_CASE("a window is answered once every GPU was read past its end, with its joules") {
  Fixture f;
  const double t0 = f.clock.unix_seconds();
  f.ask(0, 0, Fixture::window(EnergyQuestion::Op::kBegin, t0));
  CHECK_FALSE(f.answer(0, 0));  // a begin has no answer
  f.clock.advance(2500ms);
  const double t1 = f.clock.unix_seconds();
  f.ask(0, 1, Fixture::window(EnergyQuestion::Op::kEnd, t1));
  // The monitor has not read the GPUs since t0: no extrapolated answer.
  CHECK_FALSE(f.answer(0, 1));
  CHECK(f.answers->pending() == 1);
  f.monitor->read_until = t1 + 0.05;
  f.clock.advance(100ms);
  const auto a = f.answer(0, 1);
  REQUIRE(a);
  CHECK(f.answers->pending() == 0);
  CHECK(a->at("name").as_string() == "eval");
  CHECK(num(a->at("seconds")) == doctest::Approx(2.5));
  const auto& gpus = a->at("gpus").as_array();
  REQUIRE(gpus.size() == 2);
  CHECK(num(gpus[0].at("energy_j")) == doctest::Approx(750));  // 300 W × 2.5 s
  CHECK(num(gpus[1].at("energy_j")) == doctest::Approx(500));
  CHECK(num(a->at("energy_j")) == doctest::Approx(1250));
  REQUIRE(f.records.size() == 1);
  CHECK(f.records[0].find("energy_window") != std::string::npos);
  CHECK(f.records[0].find(R"("name":"eval")") != std::string::npos);
}

TEST_CASE("one window name opened on every rank is one window per rank") {
  Fixture f;
  const double t0 = f.clock.unix_seconds();
  f.ask(0, 0, Fixture::window(EnergyQuestion::Op::kBegin, t0, 0));
  f.clock.advance(1s);
  f.ask(1, 0, Fixture::window(EnergyQuestion::Op::kBegin, f.clock.unix_seconds(), 1));
  f.clock.advance(1s);
  f.monitor->read_until = f.clock.unix_seconds();
  f.ask(0, 1, Fixture::window(EnergyQuestion::Op::kEnd, f.clock.unix_seconds(), 0));
  f.ask(1, 1, Fixture::window(EnergyQuestion::Op::kEnd, f.clock.unix_seconds(), 1));
  REQUIRE(f.answer(0, 1));
  REQUIRE(f.answer(1, 1));
  CHECK(num(f.answer(0, 1)->at("seconds")) == doctest::Approx(2));
  CHECK(num(f.answer(1, 1)->at("seconds")) == doctest::Approx(1));
  CHECK(f.records.size() == 2);
}

TEST_CASE("an end without its begin is refused, naming the window and the slot") {
  Fixture f;
  f.ask(1, 0, Fixture::window(EnergyQuestion::Op::kEnd, f.clock.unix_seconds()));
  const auto a = f.answer(1, 0);
  REQUIRE(a);
  CHECK(std::string(a->at("error").as_string())
            .find("no energy window named 'eval' is open for slot 1 (pid 4242)") !=
        std::string::npos);
}

TEST_CASE("a window whose end no reading ever covers is refused after the give-up time") {
  Fixture f;
  f.ask(0, 0, Fixture::window(EnergyQuestion::Op::kBegin, f.clock.unix_seconds()));
  f.clock.advance(1s);
  f.ask(0, 1, Fixture::window(EnergyQuestion::Op::kEnd, f.clock.unix_seconds()));
  f.clock.advance(9900ms);
  CHECK_FALSE(f.answer(0, 1));
  f.clock.advance(200ms);
  const auto a = f.answer(0, 1);
  REQUIRE(a);
  CAPTURE(a->at("error").as_string());
  CHECK(std::string(a->at("error").as_string()).find("no GPU reading came after its end") !=
        std::string::npos);
  CHECK(f.answers->pending() == 0);
}

TEST_CASE("without a monitor every question is told why") {
  Fixture f;
  f.ask(0, 0, Fixture::window(EnergyQuestion::Op::kBegin, f.clock.unix_seconds()));
  f.answers->set_reader(nullptr, "no NVML here");
  f.ask(0, 1, EnergyQuestion{});
  f.ask(0, 2, Fixture::window(EnergyQuestion::Op::kEnd, f.clock.unix_seconds()));
  REQUIRE(f.answer(0, 1));
  CHECK(f.answer(0, 1)->at("off").as_string() == "no NVML here");
  REQUIRE(f.answer(0, 2));
  CHECK(f.answer(0, 2)->at("off").as_string() == "no NVML here");
}

TEST_CASE("the stop question gets the job's stop fields; other keys are not taken") {
  Fixture f;
  f.stop =
      R"("reason":"early_stop","text":"the predicted total cost would pass","predicted_cost_j":9000)";
  EnergyQuestion q;
  q.op = EnergyQuestion::Op::kStop;
  f.ask(0, 0, q);
  const auto a = f.answer(0, 0);
  REQUIRE(a);
  CHECK(a->at("reason").as_string() == "early_stop");
  CHECK(num(a->at("predicted_cost_j")) == 9000);
  CHECK_FALSE(f.answers->on_key(keys::energy_answer(0, 4242, 0)));
  CHECK_FALSE(f.answers->on_key(keys::start(1)));
  // A question that does not parse is answered with why, so its asker does not wait.
  f.store.set(keys::energy_ask(0, 4242, 1), "{\"op\":\"watts\"}");
  CHECK(f.answers->on_key(keys::energy_ask(0, 4242, 1)));
  REQUIRE(f.answer(0, 1));
  CHECK(std::string(f.answer(0, 1)->at("error").as_string()).find("unknown op 'watts'") !=
        std::string::npos);
}

TEST_CASE("a restart drops the old processes' windows and the ends still waiting") {
  Fixture f;
  f.ask(0, 0, Fixture::window(EnergyQuestion::Op::kBegin, f.clock.unix_seconds()));
  f.clock.advance(1s);
  f.ask(0, 1, Fixture::window(EnergyQuestion::Op::kEnd, f.clock.unix_seconds()));
  f.ask(1, 0, Fixture::window(EnergyQuestion::Op::kBegin, f.clock.unix_seconds()));
  REQUIRE(f.answers->pending() == 1);
  f.answers->restart();
  CHECK(f.answers->pending() == 0);
  f.monitor->read_until = f.clock.unix_seconds() + 60;
  f.clock.advance(20s);
  CHECK_FALSE(f.answer(0, 1));  // no answer into the new attempt's keyspace
  // The old window is gone: its end is refused.
  f.ask(1, 1, Fixture::window(EnergyQuestion::Op::kEnd, f.clock.unix_seconds()));
  REQUIRE(f.answer(1, 1));
  CHECK(f.answer(1, 1)->contains("error"));
}
