#include "supervisor/asio_clock.hpp"

#include <doctest/doctest.h>
#include <boost/asio/io_context.hpp>

using namespace std::chrono_literals;
using gpurun::Clock;
using gpurun::supervisor::AsioClock;

TEST_CASE("AsioClock: a call runs on the io thread once its time has passed") {
  boost::asio::io_context io;
  AsioClock clock(io);
  const Clock::TimePoint start = clock.now();
  Clock::TimePoint ran_at{};
  Clock::Timer t = clock.schedule_after(20ms, [&] { ran_at = clock.now(); });
  CHECK(t.armed());
  io.run();
  CHECK(ran_at - start >= 20ms);
  // wall_now() first: the operands of '-' are evaluated in either order (clang: left first).
  const auto ours = clock.wall_now();
  const auto wall = std::chrono::system_clock::now() - ours;
  CHECK(wall >= 0ms);
  CHECK(wall < 1s);
}

TEST_CASE("AsioClock: a cancelled call never runs and the io loop does not wait for it") {
  boost::asio::io_context io;
  AsioClock clock(io);
  int runs = 0;
  Clock::Timer hour = clock.schedule_after(1h, [&] { ++runs; });
  // Already due (its wait completes at once) but cancelled before the io loop runs it.
  Clock::Timer due = clock.schedule_after(0ms, [&] { runs += 10; });
  Clock::Timer kept = clock.schedule_after(0ms, [&] {
    runs += 100;
    hour.cancel();
  });
  due.cancel();
  const auto start = std::chrono::steady_clock::now();
  io.run();
  CHECK(runs == 100);
  CHECK(std::chrono::steady_clock::now() - start < 10s);  // not the hour
}
