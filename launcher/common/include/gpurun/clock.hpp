// gpurun::Clock — the time seam of the supervisor: what time it is (steady and wall) and
// calls scheduled after a duration. Production uses supervisor::AsioClock (the io thread's
// steady timers, launcher/supervisor/asio_clock.hpp); tests use gpurun::FakeClock, whose
// time moves only when the test calls advance(), so a test of a deadline or a window
// advances the clock by exactly that duration instead of sleeping. docs/architecture.md#seams.
// Standard library only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace gpurun {

class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::steady_clock::time_point;  ///< for durations and deadlines
  using WallTime = std::chrono::system_clock::time_point;   ///< Unix time, for records

  /// One call scheduled by schedule_after(). Destroying the Timer, cancel(), or moving another
  /// Timer into it cancels the call: it never runs after that, even when already due. Movable,
  /// not copyable. A default-constructed Timer holds nothing.
  class Timer {
   public:
    /// What a Clock implementation keeps per call; destroying it cancels the call.
    struct Handle {
      virtual ~Handle() = default;
    };
    Timer() = default;
    explicit Timer(std::unique_ptr<Handle> handle) : handle_(std::move(handle)) {}
    void cancel() { handle_.reset(); }
    /// Scheduled and not cancelled (it may have run already).
    bool armed() const { return handle_ != nullptr; }

   private:
    std::unique_ptr<Handle> handle_;
  };

  virtual ~Clock() = default;
  /// Monotonic time. Any thread.
  virtual TimePoint now() const = 0;
  /// Wall time (CLOCK_REALTIME in production). Any thread.
  virtual WallTime wall_now() const = 0;
  /// Calls `fn` once, `after` from now (0 or negative: as soon as possible, never inside this
  /// call), on the clock's thread: the io thread for AsioClock, the caller of advance() for
  /// FakeClock. Call it on that thread too. The Timer must not outlive the clock.
  [[nodiscard]] virtual Timer schedule_after(Duration after, std::function<void()> fn) = 0;

  /// wall_now() as Unix seconds.
  double unix_seconds() const {
    return std::chrono::duration<double>(wall_now().time_since_epoch()).count();
  }
  /// wall_now() as Unix milliseconds (the unit of lease ends, docs/sharing.md).
  int64_t unix_ms() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(wall_now().time_since_epoch())
        .count();
  }
};

/// A clock that moves only in advance(): it starts at steady time `start` (default: an
/// arbitrary fixed point) and Unix time `wall_start` (default 2026-01-01T00:00:00Z), and both
/// advance together. Scheduled calls run inside advance(), in order of due time (ties: in
/// order of scheduling), each with now() equal to its due time; a call may schedule or
/// cancel others, and those due within the same advance() run in it too. now(), wall_now()
/// and schedule_after() may be called from any thread; advance() from one thread at a time.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(WallTime wall_start = WallTime(std::chrono::seconds(1767225600)),
                     TimePoint start = TimePoint(std::chrono::hours(1)));
  ~FakeClock() override;
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  TimePoint now() const override;
  WallTime wall_now() const override;
  [[nodiscard]] Timer schedule_after(Duration after, std::function<void()> fn) override;

  /// Moves time forward by `d` (>= 0), running every call due by then. Returns how many ran.
  int advance(Duration d);
  /// Calls scheduled and neither run nor cancelled.
  std::size_t pending() const;

 private:
  class Entry;
  using Key = std::pair<TimePoint, uint64_t>;  // (due, sequence)
  void cancel(const Key& key);

  mutable std::mutex mu_;
  TimePoint now_;
  const TimePoint start_;
  const WallTime wall_start_;
  uint64_t next_seq_ = 0;
  std::map<Key, std::function<void()>> queue_;
};

}  // namespace gpurun
