// Job, energy questions: the program's rt.energy(), energy windows and stop_reason's detail
// (docs/energy.md#from-the-program), answered by node 0's gpurun from its energy monitor.
#include <signal.h>

#include <fmt/format.h>

#include "app/job.hpp"
#include "energy/cost.hpp"
#include "supervisor/process_spawner.hpp"

namespace gpurun::app {

namespace en = gpurun::energy;

void Job::start_energy_answers() {
  answers_store_ = std::make_unique<store::BackendStore>(store_->backend());
  en::AnswerOptions ao;
  ao.job_start_s = job_start_s_;
  if (energy_config_) ao.retry = energy_config_->energy.period;
  energy_answers_ = std::make_unique<en::EnergyAnswers>(
      *answers_store_, clock_, events_, [this] { return stop_fields(); }, ao);
}

std::string Job::stop_fields() const {
  using en::detail::json_number;
  using en::detail::json_string;
  if (energy_ && energy_->stopped_early()) {
    const double so_far = energy_->cost_total_j(), next = energy_->predicted_next_cost_j();
    return fmt::format(
        R"("reason":"early_stop","text":{},"cost_so_far_j":{},"predicted_next_cost_j":{},)"
        R"("predicted_cost_j":{},"threshold_j":{})",
        json_string(early_stop_text_), json_number(so_far), json_number(next),
        json_number(so_far + next),
        energy_->threshold_j() ? json_number(*energy_->threshold_j()) : std::string("null"));
  }
  const int sig = supervisor_ ? supervisor_->shutdown_signal() : 0;
  if (sig == 0) return {};
  const bool preempted = sig == opt_.preempt_signal;
  return fmt::format(
      R"("reason":"stop","cause":{},"signal":{},"text":{})",
      json_string(preempted ? "preemption" : "signal"), json_string(supervisor::signal_name(sig)),
      json_string(preempted ? fmt::format("gpurun received the preemption signal {} (--requeue): "
                                          "the job stopped at the workers' next boundary",
                                          supervisor::signal_name(sig))
                            : fmt::format("gpurun received {}: the job stopped at the workers' "
                                          "next boundary",
                                          supervisor::signal_name(sig))));
}

}  // namespace gpurun::app
