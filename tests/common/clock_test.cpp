#include "gpurun/clock.hpp"

#include <string>
#include <vector>

#include <doctest/doctest.h>

using namespace std::chrono_literals;
using gpurun::Clock;
using gpurun::FakeClock;

TEST_CASE("FakeClock: time moves only in advance(); calls run in due order at their due time") {
  FakeClock clock;
  const Clock::TimePoint t0 = clock.now();
  const Clock::WallTime w0 = clock.wall_now();
  std::vector<std::string> ran;
  auto at = [&](const std::string& name) {
    return [&, name] { ran.push_back(name + "@" + std::to_string((clock.now() - t0) / 1ms)); };
  };
  Clock::Timer c = clock.schedule_after(300ms, at("c"));
  Clock::Timer a = clock.schedule_after(100ms, at("a"));
  Clock::Timer b = clock.schedule_after(200ms, at("b"));
  Clock::Timer b2 = clock.schedule_after(200ms, at("b2"));  // a tie: in order of scheduling
  CHECK(clock.now() == t0);
  CHECK(clock.pending() == 4);
  CHECK(clock.advance(99ms) == 0);
  CHECK(ran.empty());
  CHECK(clock.advance(1ms) == 1);
  CHECK(ran == std::vector<std::string>{"a@100"});
  CHECK(clock.advance(250ms) == 3);
  CHECK(ran == std::vector<std::string>{"a@100", "b@200", "b2@200", "c@300"});
  CHECK(clock.now() - t0 == 350ms);
  CHECK(clock.wall_now() - w0 == 350ms);
  CHECK(clock.unix_seconds() == doctest::Approx(1767225600.35));
  CHECK(clock.pending() == 0);
}

TEST_CASE("FakeClock: a cancelled call never runs, however it is cancelled") {
  FakeClock clock;
  int runs = 0;
  Clock::Timer kept = clock.schedule_after(10ms, [&] { ++runs; });
  Clock::Timer cancelled = clock.schedule_after(10ms, [&] { runs += 100; });
  cancelled.cancel();
  CHECK_FALSE(cancelled.armed());
  {
    Clock::Timer dropped = clock.schedule_after(10ms, [&] { runs += 1000; });
  }
  Clock::Timer replaced = clock.schedule_after(10ms, [&] { runs += 10000; });
  replaced = clock.schedule_after(20ms, [&] { runs += 10; });
  CHECK(clock.pending() == 2);
  CHECK(clock.advance(1s) == 2);
  CHECK(runs == 11);
  // A call may cancel another one due at the same time.
  Clock::Timer second;
  Clock::Timer first = clock.schedule_after(5ms, [&] { second.cancel(); });
  second = clock.schedule_after(5ms, [&] { runs = -1; });
  CHECK(clock.advance(5ms) == 1);
  CHECK(runs == 11);
}

TEST_CASE("FakeClock: a call that schedules the next one runs once per period, never early") {
  FakeClock clock;
  const Clock::TimePoint t0 = clock.now();
  std::vector<long> ticks;
  Clock::Timer timer;
  std::function<void()> tick = [&] {
    ticks.push_back((clock.now() - t0) / 1ms);
    timer = clock.schedule_after(60ms, tick);  // re-armed from inside its own call
  };
  timer = clock.schedule_after(60ms, tick);
  CHECK(clock.advance(179ms) == 2);
  CHECK(ticks == std::vector<long>{60, 120});
  CHECK(clock.advance(1ms) == 1);
  CHECK(ticks == std::vector<long>{60, 120, 180});
  // Due now (0 or negative): at the next advance, even advance(0), never inside schedule_after.
  bool soon = false;
  Clock::Timer now = clock.schedule_after(-5ms, [&] { soon = true; });
  CHECK_FALSE(soon);
  CHECK(clock.advance(0ms) == 1);
  CHECK(soon);
  CHECK(clock.now() - t0 == 180ms);
}
