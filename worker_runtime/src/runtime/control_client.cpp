// The real ControlClient: control::WorkerControl over the supervisor's store.
#include "runtime/control_client.hpp"

#include "gpurun/check.hpp"
#include "gpurun/control/worker_control.hpp"

namespace gpurun::rt {

namespace {

class WorkerControlClient final : public ControlClient {
 public:
  explicit WorkerControlClient(std::unique_ptr<control::WorkerControl> c) : c_(std::move(c)) {}
  const control::Decision& join() override { return c_->join(); }
  control::Decision report_and_wait(int64_t epoch, int64_t step, bool has_state,
                                    std::string snapshot) override {
    return c_->report_and_wait(epoch, step, has_state, std::move(snapshot));
  }
  std::optional<control::Decision> park_and_wait() override { return c_->park_and_wait(); }
  const control::Decision& current() const override { return c_->current(); }
  void publish_timing(int64_t generation, const std::string& json) override {
    c_->publish_timing(generation, json);
  }
  bool warm() const override { return c_->warm(); }
  std::optional<control::Decision> wait_admission() override { return c_->wait_admission(); }

 private:
  std::unique_ptr<control::WorkerControl> c_;
};

}  // namespace

std::unique_ptr<ControlClient> make_worker_control_client(
    std::unique_ptr<control::WorkerControl> control) {
  GPURUN_CHECK(control != nullptr, "make_worker_control_client(nullptr)");
  return std::make_unique<WorkerControlClient>(std::move(control));
}

}  // namespace gpurun::rt
