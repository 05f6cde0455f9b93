// gpurun::supervisor::AsioClock — gpurun::Clock on an io_context: steady_clock and
// system_clock for the time, a boost::asio::steady_timer per scheduled call, run on the
// thread that runs the io_context (the supervisor's io thread). Tests use gpurun::FakeClock.
#pragma once

#include <boost/asio/io_context.hpp>

#include "gpurun/clock.hpp"

namespace gpurun::supervisor {

/// The io_context must outlive the clock and every Timer it returned.
class AsioClock final : public Clock {
 public:
  explicit AsioClock(boost::asio::io_context& io) : io_(io) {}
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  WallTime wall_now() const override { return std::chrono::system_clock::now(); }
  /// A steady_timer on the io_context; cancelling the Timer cancels it (io_context::run
  /// does not wait for it) and its call never runs, even when it had already expired.
  [[nodiscard]] Timer schedule_after(Duration after, std::function<void()> fn) override;

 private:
  boost::asio::io_context& io_;
};

}  // namespace gpurun::supervisor
