// Job's /metrics (Prometheus) and DCGM exporter's job files: docs/metrics.md. The text is
// control::render_metrics'; this file gathers its facts from the parts Job wires.
#include "app/job.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <set>

#include <fmt/format.h>

#include "app/start_checks.hpp"
#include "gpurun/control/node_messages.hpp"
#include "gpurun/error.hpp"

namespace gpurun::app {

namespace sv = gpurun::supervisor;
namespace ctl = gpurun::control;

namespace {

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return {};
  return buf;
}

/// Whether a slot in `state` holds (or is about to use) its GPU for the job: its DCGM job
/// file exists. A parked, standby, lent or yielded slot has none.
bool holds_gpu(ctl::SlotState state) {
  switch (state) {
    case ctl::SlotState::kStarting:
    case ctl::SlotState::kActive:
    case ctl::SlotState::kOffloading:
    case ctl::SlotState::kRejoining:
    case ctl::SlotState::kWarming:
      return true;
    default:
      return false;
  }
}

bool all_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::optional<int> Job::start_metrics() {
  if (!opt_.metrics_port && !opt_.dcgm_job_dir && !health_) return std::nullopt;
  if (agent_mode()) {  // node k > 0 of an elastic job: node 0 decides and measures
    if (opt_.metrics_port || opt_.dcgm_job_dir)
      print_err(
          "metrics: --metrics-port and --dcgm-job-dir are served by node 0 of an elastic job "
          "over several nodes (its /metrics lists every node's slots); not on this node");
    return std::nullopt;
  }
  const auto page = [this] {
    return sv::Page{std::string(ctl::kMetricsContentType),
                    ctl::render_metrics(metrics_snapshot(), resize_metrics_)};
  };
  if (health_) health_->add_page("/metrics", page);
  try {
    if (opt_.metrics_port) {
      metrics_server_ = std::make_unique<sv::HealthCheckServer>(
          io_, *opt_.metrics_port,
          [this] {
            return sv::Health{!supervisor_->done(), "{}"};
          },
          opt_.metrics_address,
          fmt::format("the metrics server (--metrics-port {})", *opt_.metrics_port));
      metrics_server_->add_page("/metrics", page);
      const std::string shown = opt_.metrics_address.find(':') != std::string::npos
                                    ? "[" + opt_.metrics_address + "]"
                                    : opt_.metrics_address;
      print_err(fmt::format("metrics: http://{}:{}/metrics (Prometheus; docs/metrics.md)", shown,
                            metrics_server_->port()));
    }
    if (opt_.dcgm_job_dir) {
      dcgm_files_ = std::make_unique<ctl::DcgmJobFiles>(*opt_.dcgm_job_dir, plan_.run_id);
      dcgm_poll_ = [this] {
        if (supervisor_->done()) return;
        update_dcgm_files();
        dcgm_timer_ = clock_.schedule_after(std::chrono::milliseconds(500), dcgm_poll_);
      };
      dcgm_timer_ = clock_.schedule_after(std::chrono::milliseconds(500), dcgm_poll_);
    }
  } catch (const gpurun::Error& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitLauncherError;
  }
  return std::nullopt;
}

ctl::MetricsSnapshot Job::metrics_snapshot() {
  ctl::MetricsSnapshot s;
  s.job = plan_.run_id;
  s.hostname = host_name();
  if (elastic_) {
    s.run = ctl::run_status(elastic_->scheduler());
    s.world_size = static_cast<int>(s.run.current_active.size());
    s.lent = elastic_->lent_now();
    s.yielded = elastic_->yielded_now();
  } else if (status_spawner_) {
    s.run = status_spawner_->status();
    s.world_size = plan_.world_size;
  }
  if (energy_) {
    s.energy = energy_status(*energy_);
    for (const gpurun::energy::MonitoredGpu& g : energy_->gpus())
      s.gpus[g.slot] = ctl::GpuLabels{g.index, g.uuid, g.name};
  }
  if (progress_) {
    ctl::Progress top;
    for (int slot = 0; slot < plan_.nproc; ++slot) {
      const ctl::Progress p = progress_->read(slot);
      if (p.steps > top.steps || (p.steps == top.steps && p.time_ns > top.time_ns)) top = p;
    }
    const auto now_ns =
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count());
    s.steps = ctl::StepProgress{top.steps, step_rate_.observe(top.steps, top.time_ns, now_ns)};
  }
  return s;
}

void Job::update_dcgm_files() {
  if (!dcgm_files_) return;
  const ctl::MetricsSnapshot snap = metrics_snapshot();
  std::set<std::string> held;
  for (const ctl::SlotStatus& slot : snap.run.slots) {
    if (ctl::slot_node(slot.gpu) != 0 || !holds_gpu(slot.state)) continue;
    // The NVML index when the energy monitor knows it; else a numeric CUDA_VISIBLE_DEVICES
    // entry (taken as the index, as nvidia-smi and DCGM number GPUs by PCI bus order).
    if (auto g = snap.gpus.find(slot.gpu); g != snap.gpus.end() && g->second.index >= 0)
      held.insert(std::to_string(g->second.index));
    else if (slot.gpu >= 0 && static_cast<size_t>(slot.gpu) < plan_.gpu_ids.size() &&
             all_digits(plan_.gpu_ids[static_cast<size_t>(slot.gpu)]))
      held.insert(plan_.gpu_ids[static_cast<size_t>(slot.gpu)]);
  }
  const std::string error = dcgm_files_->update(held);
  if (!error.empty() && error != dcgm_error_) print_err("warning: " + error);
  dcgm_error_ = error;
}

void Job::stop_metrics() {
  dcgm_timer_.cancel();
  dcgm_files_.reset();  // the job's files go (its GPUs are no longer its)
  if (metrics_server_) metrics_server_->close();
}

}  // namespace gpurun::app
