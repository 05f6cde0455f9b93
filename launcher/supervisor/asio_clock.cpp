#include "supervisor/asio_clock.hpp"

#include <memory>
#include <utility>

#include <boost/asio/steady_timer.hpp>

namespace gpurun::supervisor {

namespace {

class AsioTimer final : public Clock::Timer::Handle {
 public:
  AsioTimer(boost::asio::io_context& io, Clock::Duration after, std::function<void()> fn)
      : timer_(io, after) {
    timer_.async_wait([fn = std::move(fn),
                       live = std::weak_ptr<int>(live_)](const boost::system::error_code& ec) {
      if (!ec && !live.expired()) fn();
    });
  }
  // The steady_timer's destructor cancels the wait; `live_` covers a wait that had already
  // completed and whose handler is queued.
  ~AsioTimer() override = default;

 private:
  std::shared_ptr<int> live_ = std::make_shared<int>(0);
  boost::asio::steady_timer timer_;
};

}  // namespace

Clock::Timer AsioClock::schedule_after(Duration after, std::function<void()> fn) {
  return Timer(std::make_unique<AsioTimer>(io_, after, std::move(fn)));
}

}  // namespace gpurun::supervisor
