// EnergyClient (gpurun/worker/energy_client.hpp), a C++ program's energy questions, against
// gpurun's own answers (energy/energy_answers.hpp) over one in-memory store: the client asks
// on its thread, the test plays gpurun's io thread (the store observer's calls, a FakeClock).
#include "gpurun/worker/energy_client.hpp"

#include <doctest/doctest.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "energy/energy_answers.hpp"
#include "gpurun/clock.hpp"
#include "gpurun/error.hpp"
#include "testing/memory_store.hpp"

namespace {

using gpurun::control::EnergyClient;
using namespace std::chrono_literals;

// A Store over a MemoryStore that hands every key set to the test (the write observer's part).
class ObservedStore final : public gpurun::store::Store {
 public:
  explicit ObservedStore(gpurun::store::testing::MemoryStore& m) : m_(m) {}
  void set(const std::string& k, const std::string& v) override {
    m_.set(k, v);
    std::lock_guard<std::mutex> lock(mu_);
    written_.push_back(k);
    cv_.notify_all();
  }
  std::string get(const std::string& k, std::chrono::milliseconds t) override {
    return m_.get(k, t);
  }
  std::optional<std::string> try_get(const std::string& k) override { return m_.try_get(k); }
  void wait(const std::vector<std::string>& k, std::chrono::milliseconds t) override {
    m_.wait(k, t);
  }
  std::string compare_set(const std::string& k, const std::string& e,
                          const std::string& d) override {
    return m_.compare_set(k, e, d);
  }
  int64_t add(const std::string& k, int64_t d) override { return m_.add(k, d); }
  bool remove(const std::string& k) override { return m_.remove(k); }
  // The next key the client wrote (waits for it).
  std::string next_written() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !written_.empty(); });
    std::string k = written_.front();
    written_.pop_front();
    return k;
  }

 private:
  gpurun::store::testing::MemoryStore& m_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> written_;
};

// Slot 0 draws 300 W, slot 1 200 W since Unix time 0, read up to `read_until`.
struct FakeMonitor final : gpurun::energy::EnergyReader {
  double read_until = 0;
  std::vector<gpurun::energy::EpochRecord> recs;
  std::optional<std::map<int, double>> counters_at(double t) const override {
    if (t > read_until) return std::nullopt;
    return std::map<int, double>{{0, 300 * t}, {1, 200 * t}};
  }
  std::vector<int> active() const override { return {0, 1}; }
  std::map<int, std::pair<double, double>> job_and_epoch_j() const override {
    return {{0, {1000, 100}}, {1, {800, 80}}};
  }
  const std::vector<gpurun::energy::EpochRecord>& epochs() const override { return recs; }
  std::optional<double> threshold_j() const override { return std::nullopt; }
};

struct Gpurun {  // node 0's side: the answers on the test's thread
  gpurun::store::testing::MemoryStore memory;
  gpurun::FakeClock clock;
  gpurun::supervisor::EventLog events;
  FakeMonitor* monitor = nullptr;
  std::unique_ptr<gpurun::energy::EnergyAnswers> answers;
  Gpurun() {
    answers = std::make_unique<gpurun::energy::EnergyAnswers>(memory, clock, events, [] {
      return std::string(R"("reason":"early_stop","text":"stopped","predicted_cost_j":9070.5)");
    });
    auto m = std::make_unique<FakeMonitor>();
    monitor = m.get();
    answers->set_reader(std::move(m));
  }
};

}  // namespace

TEST_CASE("a C++ program's energy, window and stop questions get gpurun's figures") {
  Gpurun g;
  auto store = std::make_unique<ObservedStore>(g.memory);
  ObservedStore& seen = *store;
  EnergyClient client(std::move(store), 1);
  gpurun::energy::EpochRecord e;
  e.epoch = 0;
  e.seconds = 2;
  e.energy_j = 900;
  e.cost = 950;
  e.gpu_energy_j = {{0, 500}, {1, 400}};
  g.monitor->recs.push_back(e);

  std::optional<gpurun::control::EnergyReading> reading;
  std::optional<gpurun::control::EnergyMeasurement> window;
  std::optional<gpurun::control::StopDetail> stop;
  std::thread program([&] {
    reading = client.energy(1);
    client.begin_window("eval", 1);
    window = client.end_window("eval", 1);
    stop = client.stop_detail();
  });
  CHECK(g.answers->on_key(seen.next_written()));  // energy
  CHECK(g.answers->on_key(seen.next_written()));  // begin
  CHECK(g.answers->on_key(seen.next_written()));  // end: waits for a reading after it
  g.monitor->read_until = 4e9;
  g.clock.advance(100ms);
  CHECK(g.answers->on_key(seen.next_written()));  // stop
  program.join();

  REQUIRE(reading);
  CHECK(reading->total_energy_j == 1800);
  CHECK(reading->epoch_gpu_energy_j == std::map<int, double>{{0, 100}, {1, 80}});
  CHECK(reading->epoch == 1);
  REQUIRE(reading->epochs.size() == 1);
  CHECK(reading->epochs[0].energy_j == 900);
  CHECK(reading->epochs[0].gpu_energy_j == std::map<int, double>{{0, 500}, {1, 400}});
  REQUIRE(window);
  CHECK(window->name == "eval");
  CHECK(window->seconds >= 0);
  CHECK(window->gpu_energy_j.size() == 2);
  CHECK(window->total_energy_j() ==
        doctest::Approx(window->gpu_energy_j[0] + window->gpu_energy_j[1]));
  REQUIRE(stop);
  CHECK(stop->reason == "early_stop");
  CHECK(stop->predicted_cost_j == 9070.5);
}

TEST_CASE("without gpurun's monitor the client says why; misuse and silence are errors") {
  Gpurun g;
  g.answers->set_reader(nullptr, "no NVML here");
  auto store = std::make_unique<ObservedStore>(g.memory);
  ObservedStore& seen = *store;
  EnergyClient client(std::move(store), 2, 200ms);
  std::optional<gpurun::control::EnergyReading> reading{gpurun::control::EnergyReading{}};
  std::thread program([&] { reading = client.energy(); });
  CHECK(g.answers->on_key(seen.next_written()));
  program.join();
  CHECK_FALSE(reading);
  CHECK(client.off_reason() == "no NVML here");

  CHECK_THROWS_WITH_AS(client.end_window("eval"),
                       doctest::Contains("'eval' is not open on slot 2 (begin_window first)"),
                       gpurun::UsageError);
  client.begin_window("eval");
  CHECK_THROWS_WITH_AS(client.begin_window("eval"), doctest::Contains("already open"),
                       gpurun::UsageError);
  CHECK_THROWS_AS(client.begin_window(""), gpurun::control::ProtocolError);
  // Nobody answers (gpurun gone): the question's own timeout, naming it.
  CHECK_THROWS_WITH_AS(
      client.energy(),
      doctest::Contains("slot 2: no answer from gpurun to the energy question 'energy' within"),
      gpurun::StoreTimeout);
}
