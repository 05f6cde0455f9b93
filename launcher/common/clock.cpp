#include "gpurun/clock.hpp"

#include <algorithm>

namespace gpurun {

class FakeClock::Entry final : public Clock::Timer::Handle {
 public:
  Entry(FakeClock& clock, Key key) : clock_(clock), key_(key) {}
  ~Entry() override { clock_.cancel(key_); }

 private:
  FakeClock& clock_;
  Key key_;
};

FakeClock::FakeClock(WallTime wall_start, TimePoint start)
    : now_(start), start_(start), wall_start_(wall_start) {}

FakeClock::~FakeClock() = default;

Clock::TimePoint FakeClock::now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

Clock::WallTime FakeClock::wall_now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wall_start_ + std::chrono::duration_cast<WallTime::duration>(now_ - start_);
}

Clock::Timer FakeClock::schedule_after(Duration after, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  const Key key{now_ + std::max(after, Duration::zero()), next_seq_++};
  queue_.emplace(key, std::move(fn));
  return Timer(std::make_unique<Entry>(*this, key));
}

void FakeClock::cancel(const Key& key) {
  std::function<void()> dropped;  // destroyed outside the lock: it may own a Timer
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = queue_.find(key); it != queue_.end()) {
    dropped = std::move(it->second);
    queue_.erase(it);
  }
}

int FakeClock::advance(Duration d) {
  int ran = 0;
  std::unique_lock<std::mutex> lock(mu_);
  const TimePoint target = now_ + std::max(d, Duration::zero());
  while (!queue_.empty() && queue_.begin()->first.first <= target) {
    auto it = queue_.begin();
    now_ = std::max(now_, it->first.first);
    std::function<void()> fn = std::move(it->second);
    queue_.erase(it);
    lock.unlock();  // the call may schedule, cancel, or read the time
    fn();
    fn = nullptr;
    ++ran;
    lock.lock();
  }
  now_ = target;
  return ran;
}

std::size_t FakeClock::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace gpurun
