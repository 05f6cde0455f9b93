// LeaseKeeper on a FakeClock: leases made and reclaimed through the file, ended by the clock.
// launcher/control/lease_keeper.hpp, docs/sharing.md.
#include "control/lease_keeper.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include "gpurun_process.hpp"

namespace gpurun::control {
namespace {

using namespace std::chrono_literals;

/// The watcher's quiet time: a change of the file is read this long after it at the latest.
constexpr auto kDebounce = 100ms;

/// A keeper on a FakeClock that records every change; the io_context runs on the test
/// thread only in pump(), which handles the file events the kernel has queued (inotify
/// queues them inside the rename that causes them), and advance(), which moves the clock.
class Keeper {
 public:
  explicit Keeper(const std::string& run_dir) {
    WatcherOptions watcher;
    watcher.debounce = kDebounce;
    watcher.settle = 25ms;
    watcher.poll_interval = 1h;  // only inotify reports changes within the test's time
    watcher.clock = &clock_;
    keeper_ = std::make_unique<LeaseKeeper>(
        io_, run_dir, watcher,
        [this](const std::vector<LeaseKeeper::Change>& c) {
          changes_.insert(changes_.end(), c.begin(), c.end());
        },
        [this](const std::string& e) { errors_.push_back(e); });
  }
  void pump() {
    io_.restart();
    while (io_.poll() > 0) {
    }
  }
  /// pump(), the clock moved by `d` (running what is due), pump().
  void advance(std::chrono::milliseconds d) {
    pump();
    clock_.advance(d);
    pump();
  }
  gpurun::FakeClock& clock() { return clock_; }
  LeaseKeeper& keeper() { return *keeper_; }
  /// The changes since the last call.
  std::vector<LeaseKeeper::Change> take() { return std::exchange(changes_, {}); }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  boost::asio::io_context io_;
  gpurun::FakeClock clock_;  // outlives the keeper and its timers
  std::unique_ptr<LeaseKeeper> keeper_;
  std::vector<LeaseKeeper::Change> changes_;
  std::vector<std::string> errors_;
};

Lease lease(std::vector<int> gpus, int64_t since_ms, std::optional<int64_t> until_ms) {
  Lease l;
  l.gpus = std::move(gpus);
  l.since_ms = since_ms;
  l.until_ms = until_ms;
  l.note = "bob";
  return l;
}

TEST_CASE("LeaseKeeper: a lease ends when the clock reaches its end, and leaves the file") {
  gpurun::testing::TempDir dir;
  Keeper k(dir.str());
  const int64_t t0 = k.clock().unix_ms();
  const Lease lent = lease({2}, t0, t0 + 60'000);  // `gpurun lend 2 --for 60s`
  update_leases(leases_path(dir.str()), [&](std::vector<Lease>) { return std::vector{lent}; });
  k.advance(kDebounce);
  auto changes = k.take();
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].event == "lease");
  CHECK(changes[0].lease == lent);
  CHECK(k.keeper().leases() == std::vector{lent});

  k.advance(std::chrono::milliseconds(t0 + 60'000 - 1 - k.clock().unix_ms()));
  CHECK(k.take().empty());  // 1 ms before its end: still lent
  CHECK(k.keeper().leases() == std::vector{lent});
  k.advance(1ms);
  changes = k.take();
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].event == "lease_end");
  CHECK(changes[0].why == "expired");
  CHECK(changes[0].lease == lent);
  CHECK(k.keeper().leases().empty());
  CHECK(read_leases(leases_path(dir.str())).empty());  // the keeper rewrote the file
  k.advance(1h);  // its own rewrite of the file is no new change
  CHECK(k.take().empty());
  CHECK(k.errors().empty());
}

TEST_CASE("LeaseKeeper: a reclaim ends an open lease as reclaimed, a partial one says which") {
  gpurun::testing::TempDir dir;
  Keeper k(dir.str());
  const int64_t t0 = k.clock().unix_ms();
  const Lease lent = lease({1, 2}, t0, std::nullopt);  // no end: until reclaimed
  const std::string path = leases_path(dir.str());
  update_leases(path, [&](std::vector<Lease>) { return std::vector{lent}; });
  k.advance(kDebounce);
  REQUIRE(k.take().size() == 1);

  k.advance(24h);  // an open lease never ends by itself
  CHECK(k.take().empty());
  CHECK(k.keeper().leases() == std::vector{lent});

  const Lease narrowed = lease({2}, t0, std::nullopt);  // `gpurun reclaim 1`
  update_leases(path, [&](std::vector<Lease>) { return std::vector{narrowed}; });
  k.advance(kDebounce);
  auto changes = k.take();
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].event == "lease_end");
  CHECK(changes[0].why == "reclaimed");
  CHECK(changes[0].lease.gpus == std::vector<int>{1});

  update_leases(path, [](std::vector<Lease>) { return std::vector<Lease>{}; });  // all back
  k.advance(kDebounce);
  changes = k.take();
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].event == "lease_end");
  CHECK(changes[0].why == "reclaimed");
  CHECK(changes[0].lease == narrowed);
  CHECK(k.keeper().leases().empty());
}

}  // namespace
}  // namespace gpurun::control
