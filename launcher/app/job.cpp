#include "app/job.hpp"

#include "energy/simulated_gpus.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/post.hpp>

#include "app/start_checks.hpp"
#include "energy/nvml.hpp"
#include "gpurun/control/node_messages.hpp"
#include "gpurun/env_names.hpp"
#include "gpurun/error.hpp"
#include "nodes/master_address.hpp"
#include "supervisor/process_spawner.hpp"  // signal_name
#include "supervisor/worker_env.hpp"

namespace gpurun::app {

namespace asio = boost::asio;
namespace sv = gpurun::supervisor;

namespace {

// This node's slots of a job-wide set: the energy monitor measures this node's GPUs only (another
// node's slots, gpurun/control/node_messages.hpp, are not its GPUs).
std::vector<int> own_slots(const std::vector<int>& active) {
  std::vector<int> out;
  for (int slot : active)
    if (gpurun::control::slot_node(slot) == 0) out.push_back(slot);
  return out;
}

}  // namespace

Job::Job(Launch launch, sv::ConsoleWriter& console_writer)
    : launch_(std::move(launch)), console_writer_(console_writer) {}

Job::~Job() = default;

int Job::run() {
  if (const auto code = prepare_nodes()) return *code;
  if (const auto code = open_store_and_run_dir()) return *code;
  if (const auto code = simulate_gpus()) return *code;
  announce();
  if (const auto code = build_supervisor()) return *code;
  wire_supervisor();
  wire_nodes();
  if (const auto code = start_health_check()) return *code;
  if (const auto code = start_metrics()) return *code;
  wire_done();
  route_signals();
  return finish(run_to_end());
}

std::optional<int> Job::open_store_and_run_dir() {
  // Preemption timing: under Slurm the defaults fit inside KillWait.
  stop_timing_ = sv::stop_timing(opt_, inherited_);
  if (!stop_timing_.note.empty()) print_err(stop_timing_.note);

  // [notify] command (docs/sharing.md#notifications): every notable event, from any part of
  // gpurun, through the event log. Destroyed after the supervisor: what is queued still runs.
  if (config_ && !config_->notify.command.empty()) {
    notifier_ = std::make_unique<sv::Notifier>(
        config_->notify.command, config_->notify.timeout,
        [](const std::string& line) { print_err("warning: " + line); });
  }
  // /metrics counts the resize events (docs/metrics.md).
  const auto observe = [this](sv::EventLog& log) {
    log.set_observer(
        [this, n = notifier_.get()](std::string_view event, const std::string& record) {
          if (n) n->post(event, record);
          resize_metrics_.on_event(event, record);
        });
  };
  observe(events_);
  try {
    if (opt_.event_log) {
      events_ = sv::EventLog(*opt_.event_log);
      observe(events_);
    }
    if (plan_.node_rank == 0) {
      gpurun::store::ServerOptions so;
      so.hosts = store_hosts_;
      so.port = plan_.master_port;
      so.free_port_if_busy = sv::may_take_free_port(plan_.nnodes, opt_.master_port_given,
                                                    inherited_.count("MASTER_PORT") != 0);
      if (opt_.store_memory_budget) so.memory_budget_bytes = *opt_.store_memory_budget;
      so.log = [](const std::string& line) { print_err(line); };  // lines start "store: "
      store_ = std::make_unique<gpurun::store::Server>(io_, std::move(so));
      if (plan_.nnodes > 1 && plan_.master_port == 0)
        print_err(
            fmt::format("node 0's store listens on port {}: start the other nodes with "
                        "--master-port {}",
                        store_->port(), store_->port()));
      if (plan_.master_port != 0 && store_->port() != plan_.master_port)  // busy; nobody chose it
        print_err(sv::free_port_note(plan_.master_port, store_hosts_.front(), store_->port()));
      plan_.master_port = store_->port();
    }
    if (!opt_.log_dir) sv::remove_stale_run_dirs(sv::temp_run_base());  // left by kill -9
    run_dir_ = sv::make_run_dir(opt_.log_dir, plan_.run_id);
    plan_.run_dir = run_dir_.path;
    {  // the worker engine's C library of this gpurun, for the Python package
      std::error_code ec_self;
      const auto self = std::filesystem::read_symlink("/proc/self/exe", ec_self);
      if (!ec_self) plan_.worker_library = sv::find_worker_library(self.string());
    }
  } catch (const gpurun::Error& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitLauncherError;
  }
  return std::nullopt;
}

std::optional<int> Job::simulate_gpus() {
  if (!opt_.simulate_gpus) return std::nullopt;
  try {
    const auto gpus = gpurun::energy::simulated_gpus(*opt_.simulate_gpus);
    // Slot k is simulated GPU k (CUDA ordinal k): every slot the job may use needs one.
    const std::vector<int>& slots = config_ ? slot_ids_ : launch_ids_;
    const int needed = slots.empty() ? 0 : *std::max_element(slots.begin(), slots.end()) + 1;
    if (static_cast<size_t>(needed) > gpus.gpus.size())
      throw gpurun::UsageError(fmt::format(
          "--simulate-gpus {} gives {} GPU(s), but slot {} needs GPU {}: simulate at least {}",
          *opt_.simulate_gpus, gpus.gpus.size(), needed - 1, needed - 1, needed));
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    const std::string state = gpurun::energy::install_simulated_gpus(
        gpus, run_dir_.path,
        ec ? std::string() : sv::find_library_beside(self.string(), "libgpurun_simulated_nvml.so"));
    print_err(fmt::format("energy: {} simulated GPU(s), no NVIDIA driver used (state: {})",
                          gpus.gpus.size(), state));
  } catch (const gpurun::UsageError& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitUsage;
  } catch (const gpurun::Error& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitLauncherError;
  }
  return std::nullopt;
}

void Job::announce() {
  files_in_temp_ = run_dir_.temporary && (opt_.redirects.any() || opt_.tee.any());
  console_writer_.set_drop_hint(opt_.log_dir || files_in_temp_
                                    ? fmt::format("the log files under {} have them", run_dir_.path)
                                    : std::string("--log-dir keeps every worker line in files"));
  if (opt_.log_dir)
    print_err(fmt::format("logs: {}", run_dir_.path));
  else if (files_in_temp_)
    print_err(fmt::format(
        "warning: --redirects/--tee without --log-dir: the log files go to {} (kept after exit)",
        run_dir_.path));
  if (plan_.set_omp_num_threads)
    print_err(
        fmt::format("setting OMP_NUM_THREADS=1 for each of the {} workers to avoid overloading the "
                    "machine; set OMP_NUM_THREADS yourself to tune it",
                    launch_ids_.size()));

  events_.emit("start", sv::JsonObject()
                            .add("run_id", plan_.run_id)
                            .add("nproc", static_cast<int64_t>(launch_ids_.size()))
                            .add("slots", plan_.nproc)
                            .add("world_size", plan_.world_size)
                            .add("node_rank", plan_.node_rank)
                            .add("master_addr", plan_.master_addr)
                            .add("master_port", static_cast<int>(plan_.master_port))
                            .add("max_restarts", plan_.max_restarts)
                            .add("cmd", opt_.command)
                            .add("executable", exe_));
}

std::optional<int> Job::build_supervisor() {
  // Energy (docs/energy.md): the workers' step progress file, then the monitor.
  if (config_) {
    try {
      progress_ =
          std::make_unique<gpurun::control::ProgressFile>(plan_.run_dir + "/progress", plan_.nproc);
    } catch (const gpurun::Error& e) {
      print_err(
          fmt::format("warning: {} (no step progress for the power-limit profiler)", e.what()));
    }
  }
  // NVML and CUDA initialise on their own thread while the workers start (it can take ~1 s).
  // (Not on node k > 0 of an elastic job: node 0 decides, and its monitor charges its own GPUs.)
  monitor_energy_ = !agent_mode() && energy_wanted(opt_, plan_, config_);
  job_start_s_ = gpurun::energy::EnergyMonitor::now_s();
  if (monitor_energy_)
    discovery_ = std::async(std::launch::async, discover_gpus, std::cref(inherited_),
                            config_ ? slot_ids_ : launch_ids_);
  // [energy] settings, kept for when discovery is done (config is moved into the controller).
  energy_config_ = config_;

  sv::SupervisorOptions so;
  so.plan = plan_;
  so.argv = wargv_;
  so.local_rank_argument = opt_.local_rank_argument;
  // After the program (the script, module or binary: the command's first word), before its
  // arguments: the worker command is the interpreter's words, then the command.
  so.local_rank_argument_at = wargv_.size() - opt_.command.size() + 1;
  so.display_name = display_name_;
  so.inherited = inherited_;
  if (progress_) so.inherited[gpurun::env::kProgressFile] = progress_->path();
  so.grace_period = stop_timing_.grace_period;
  so.stop_timeout = stop_timing_.stop_timeout;
  so.preempt_signal = opt_.preempt_signal;
  so.stop_on_preempt = opt_.requeue;
  so.keep_logs = opt_.log_dir.has_value();
  so.redirects = opt_.redirects;
  so.tee = opt_.tee;
  so.ranks_filter = opt_.ranks_filter;
  so.local_ranks_filter = opt_.local_ranks_filter;
  so.prefix_template = opt_.log_line_prefix_template;

  posix_spawner_ =
      std::make_unique<sv::PosixSpawner>(io_, sv::PosixSpawnerOptions{fd_limit_.original});
  // Plain runs keep status.json through the spawner; elastic runs through their controller.
  if (!config_) {
    gpurun::control::StatusSnapshot snap;
    snap.run_id = plan_.run_id;
    snap.run_dir = plan_.run_dir;
    snap.supervisor_pid = static_cast<int>(::getpid());
    snap.physical_gpus = plan_.gpu_ids;
    if (monitor_energy_)
      snap.energy = [this] {
        return energy_ ? energy_status(*energy_) : gpurun::control::EnergyStatus{};
      };
    status_spawner_ = std::make_unique<gpurun::control::StatusSpawner>(
        io_, *posix_spawner_, console_, plan_.nproc, std::move(snap));
  }
  sv::ProcessSpawner& spawner =
      status_spawner_ ? static_cast<sv::ProcessSpawner&>(*status_spawner_) : *posix_spawner_;
  supervisor_ = std::make_unique<sv::Supervisor>(io_, so, spawner, console_, events_);
  if (agent_mode()) {  // node k > 0 of an elastic job: its slots run on node 0's commands
    build_agent();
    return std::nullopt;
  }
  if (config_) {
    gpurun::control::ElasticOptions eo;
    eo.config_path = std::filesystem::absolute(*opt_.config);
    eo.slots = slot_ids_;
    eo.launch = launch_ids_;
    eo.physical_gpus = plan_.gpu_ids;
    eo.run_id = plan_.run_id;
    eo.run_dir = plan_.run_dir;
    if (plan_.nnodes > 1) {  // node 0 of an elastic job over several nodes
      gpurun::control::NodeHubOptions nh;
      nh.run_id = plan_.run_id;
      nh.max_nodes = std::max(opt_.nnodes, opt_.nnodes_max);
      nh.node_timeout = opt_.node_timeout;  // a node silent that long is lost (a cut link)
      try {                                 // never severed: node 0's host's own
        for (const sv::InterfaceAddress& a : sv::interface_addresses())
          nh.own_addresses.push_back(a.address);
      } catch (const gpurun::Error& e) {
        print_err(fmt::format("warning: {}: a lost node's address is never severed", e.what()));
        nh.sever = false;
      }
      eo.nodes = nh;
      // Its pause snapshot goes to the other nodes from where its store listens.
      eo.snapshot_endpoint = serve_snapshots(store_hosts_.front(), plan_.master_addr, plan_.run_id);
      if (snapshot_fetcher_) eo.fetch_snapshot = snapshot_fetch();
      print_err(fmt::format(
          "nodes: node 0 of an elastic job of up to {} nodes: another node's gpurun joins it "
          "with --config FILE --nnodes {} --node-rank 1 --master-addr {} --master-port {} (any "
          "--node-rank above 0; its slots enter at a boundary)",
          nh.max_nodes,
          opt_.nnodes == opt_.nnodes_max ? std::to_string(opt_.nnodes)
                                         : fmt::format("{}:{}", opt_.nnodes, opt_.nnodes_max),
          plan_.master_addr, plan_.master_port));
    }
    if (monitor_energy_)
      eo.energy_status = [this] {
        return energy_ ? energy_status(*energy_) : gpurun::control::EnergyStatus{};
      };
    try {
      elastic_ = std::make_unique<gpurun::control::ElasticController>(
          io_, store_->backend(), *supervisor_, events_, console_, std::move(*config_), eo);
    } catch (const gpurun::Error& e) {
      print_err(fmt::format("error: {}", e.what()));
      return kExitLauncherError;
    }
    supervisor_->set_controller(elastic_.get());
    start_energy_answers();
    gpurun::control::EnergyHooks hooks;
    hooks.store_write = [this](const std::string& key) {
      return energy_answers_ && energy_answers_->on_key(key);
    };
    if (monitor_energy_) {
      // The monitor may not exist yet (or ever: no NVML): every hook checks.
      hooks.active_changed = [this](const std::vector<int>& active) {
        if (energy_) energy_->set_active(own_slots(active), elastic_->scheduler().generation());
      };
      hooks.boundary =
          [this](const gpurun::control::BoundaryInfo& b) -> std::optional<std::string> {
        if (!energy_) return std::nullopt;
        const double t = b.time_ms > 0 ? static_cast<double>(b.time_ms) / 1000.0
                                       : gpurun::energy::EnergyMonitor::now_s();
        energy_->close_window(t, b.step == 0 ? "epoch" : "steps", b.generation, b.epoch, b.step);
        if (b.step != 0) return std::nullopt;
        std::optional<std::string> why = energy_->end_epoch(b.epoch);
        if (why) early_stop_text_ = *why;  // rt.stop_reason's text
        return why;
      };
      hooks.training_finished = [this](int64_t final_epoch) {
        if (!energy_) return;
        energy_->close_window(gpurun::energy::EnergyMonitor::now_s(), "epoch", -1, final_epoch, 0);
        energy_->end_epoch(final_epoch, /*may_stop=*/false);  // training is over: no stop
      };
    }
    elastic_->set_energy_hooks(std::move(hooks));
  }
  return std::nullopt;
}

void Job::wire_supervisor() {
  // status.json's energy columns change without protocol events: refresh it every second.
  refresh_ = [&] {
    if (supervisor_->done()) return;
    if (elastic_) elastic_->publish_status();
    if (status_spawner_) status_spawner_->publish_status();
    status_refresh_ = clock_.schedule_after(std::chrono::seconds(1), refresh_);
  };
  if (monitor_energy_) status_refresh_ = clock_.schedule_after(std::chrono::seconds(1), refresh_);
  // Every run registers, so `gpurun status` finds it.
  registration_ = std::make_unique<gpurun::control::RunRegistration>(plan_.run_id, plan_.run_dir);
  if (!registration_->error().empty()) print_err("warning: " + registration_->error());
  supervisor_->on_restart = [&](int attempt) {
    // Multi-node: node 0's NodeSync reset the store before it told the nodes to restart.
    if (store_ && !node_sync_) store_->reset_keyspace("gpurun/");
    if (energy_) energy_->restart(attempt);
    if (energy_answers_) energy_answers_->restart();  // the old processes' windows go
  };
  // An early stop by the energy monitor: every worker exited 0, gpurun exits 3.
  supervisor_->final_status = [&](int exit_code) -> std::optional<std::pair<int, std::string>> {
    if (!energy_ || !energy_->stopped_early() || exit_code != 0) return std::nullopt;
    return std::make_pair(int{gpurun::energy::EnergyMonitor::kExitEarlyStop},
                          std::string("stopped early by the energy cost threshold"));
  };
}

std::optional<int> Job::start_health_check() {
  // torchrun's TORCHELASTIC_HEALTH_CHECK_PORT (docs/cli.md#health-check): 200 while the job
  // runs, 503 once it stops or ended.
  if (const auto hc = inherited_.find("TORCHELASTIC_HEALTH_CHECK_PORT"); hc != inherited_.end()) {
    try {
      health_ =
          std::make_unique<sv::HealthCheckServer>(io_, sv::health_check_port(hc->second), [this] {
            const bool stopping = supervisor_->shutdown_signal() != 0;
            const bool done = supervisor_->done();
            sv::Health h;
            h.alive = !done && !stopping;
            h.json = sv::JsonObject()
                         .add("alive", h.alive)
                         .add("state", done       ? "done"
                                       : stopping ? "stopping"
                                                  : "running")
                         .add("run_id", plan_.run_id)
                         .add("node_rank", plan_.node_rank)
                         .add("attempt", supervisor_->attempt())
                         .add("workers", static_cast<int64_t>(supervisor_->worker_pids().size()))
                         .add("uptime_s", gpurun::energy::EnergyMonitor::now_s() - job_start_s_)
                         .str();
            return h;
          });
      print_err(fmt::format("health check: http://127.0.0.1:{}/ (TORCHELASTIC_HEALTH_CHECK_PORT)",
                            health_->port()));
    } catch (const gpurun::UsageError& e) {  // torchrun's agent logs it and goes on: so do we
      print_err(fmt::format("warning: {}; no health check server is started", e.what()));
    } catch (const gpurun::Error& e) {
      print_err(fmt::format("error: {}", e.what()));
      return kExitLauncherError;
    }
  }
  return std::nullopt;
}

void Job::wire_done() {
  supervisor_->on_done = [&](int exit_code) {
    status_refresh_.cancel();
    if (health_) health_->close();
    stop_metrics();
    if (energy_) energy_->finish(exit_code);
    if (auto_scale_) auto_scale_->finish();
    const auto close_store = [&] {
      boost::system::error_code ignored;
      signals_.cancel(ignored);
      if (agent_) agent_->close();  // node 0 sees this node leave now
      if (store_) store_->close();
      io_.stop();
    };
    if (node_sync_) {  // node 0: until the other nodes have read the decision
      node_sync_->finish(close_store);
      return;
    }
    if (elastic_ && elastic_->node_hub()) {  // node 0: every other node is told, then goes
      end_nodes(exit_code, close_store);
      return;
    }
    close_store();
  };
}

void Job::end_nodes(int exit_code, std::function<void()> then) {
  gpurun::control::NodeHub& hub = *elastic_->node_hub();
  // A stop signal to node 0 (SIGTERM: at a boundary) ends every node with 128 + it, saying so.
  const int sig = supervisor_->shutdown_signal();
  // Programs of different lengths: the node whose program wanted more is told why it ended.
  const std::string& disagree = elastic_->scheduler().disagreement();
  hub.job_ended(exit_code, exit_code == 0 ? (disagree.empty() ? std::string("the job finished")
                                                              : "the job finished: " + disagree)
                           : sig != 0
                               ? fmt::format("node 0's gpurun received {}", sv::signal_name(sig))
                               : fmt::format("the job ended with exit status {}", exit_code));
  // Until every node disconnected (its lost key) or 5 s passed: a node reads its exit command
  // before node 0's store closes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  nodes_end_poll_ = [this, &hub, deadline, then] {
    if (hub.live_nodes() == 0 || std::chrono::steady_clock::now() >= deadline) {
      asio::post(io_, then);
      return;
    }
    nodes_end_timer_ = clock_.schedule_after(std::chrono::milliseconds(50), nodes_end_poll_);
  };
  nodes_end_poll_();
}

int Job::run_to_end() {
  int code = kExitLauncherError;
  try {
    if (node_sync_ && store_) {  // node 0: every node joins before any worker starts
      node_sync_->rendezvous([&](const std::string& error) {
        if (error.empty()) {
          plan_.nnodes = node_sync_->nnodes();  // --nnodes MIN:MAX: as the rendezvous closed
          plan_.world_size = plan_.nproc * plan_.nnodes;
          supervisor_->set_node_count(plan_.nnodes);
          supervisor_->start();
          return;
        }
        rendezvous_error_ = error;
        boost::system::error_code ignored;
        signals_.cancel(ignored);
        node_sync_->finish([&] {  // the joined nodes read the error first
          store_->close();
          io_.stop();
        });
      });
    } else {
      supervisor_->start();
    }
    if (discovery_.valid()) {
      // The workers are starting; the monitor begins with the job's start time.
      std::optional<DiscoveredGpus> found = discovery_.get();
      if (!found && opt_.energy_summary)
        print_err(fmt::format("energy: no summary will be written to {}: monitoring is off",
                              *opt_.energy_summary));
      if (found && !supervisor_->done()) {
        energy_ = make_energy_monitor(io_, events_, opt_, energy_config_, std::move(*found), exe_,
                                      progress_.get(), job_start_s_, run_dir_.path);
        energy_->set_active(elastic_ ? own_slots(elastic_->scheduler().active()) : launch_ids_);
        if (energy_answers_) energy_answers_->set_reader(gpurun::energy::monitor_reader(*energy_));
        // [policy] yield_to_foreign (docs/sharing.md#yield): NVML's process lists of the job's
        // GPUs, each second; the controller decides (a reload may turn the policy on or off).
        if (elastic_)
          energy_->set_process_hook(
              [this](std::map<int, std::vector<gpurun::energy::Nvml::Process>> found) {
                gpurun::control::ForeignGpus::Listing listing;
                for (const auto& [slot, procs] : found) {
                  auto& l = listing[slot];  // an empty list too: the GPU was read, and is free
                  for (const auto& p : procs) l.emplace_back(p.pid, p.used_bytes);
                }
                if (elastic_) elastic_->on_gpu_processes(listing);
              });
        if (energy_config_ && energy_config_->energy.auto_scale) {
          auto_scale_ = make_auto_scale(
              events_, [](const std::string& line) { print_err(line); }, elastic_.get(), *energy_,
              *energy_config_);
          if (auto_scale_)
            energy_->set_epoch_hook([this](const gpurun::energy::EpochRecord& rec, bool may_stop) {
              if (auto_scale_ && may_stop) auto_scale_->on_epoch(rec);
            });
        }
      }
    }
    if (energy_config_ && energy_config_->energy.auto_scale && !energy_)
      print_err(
          "energy: warning: [energy] scale = \"auto\" needs the GPU energy monitor (NVML), "
          "which is off: the job keeps its GPUs");
    if (energy_config_ && energy_config_->policy.yield_to_foreign && !energy_)
      print_err(
          "warning: [policy] yield_to_foreign needs the GPU energy monitor (NVML), "
          "which is off: no GPU is yielded");
    if (!supervisor_->done() || node_sync_) io_.run();
    if (energy_) energy_->set_epoch_hook({});  // the job is over: scale decides nothing more
    code = supervisor_->done() ? supervisor_->exit_code() : kExitLauncherError;
    if (!rendezvous_error_.empty()) {
      print_err(fmt::format("error: {}", rendezvous_error_));
      code = rendezvous_signal_ ? 128 + rendezvous_signal_ : kExitLauncherError;
    }
  } catch (const std::exception& e) {
    print_err(fmt::format("internal error: {}", e.what()));
    code = kExitLauncherError;
  }
  return code;
}

int Job::finish(int code) {
  // --requeue after a stop by SIGTERM or the preempt signal (docs/cli.md#preemption); with
  // several nodes node 0 alone requeues the job (once for every node).
  if (opt_.requeue && plan_.node_rank == 0 && supervisor_->done() &&
      supervisor_->shutdown_signal() != 0 &&
      (supervisor_->shutdown_signal() == SIGTERM ||
       supervisor_->shutdown_signal() == opt_.preempt_signal)) {
    const sv::RequeueResult rq = sv::requeue_job(inherited_);
    print_err(rq.message);
    if (rq.requeued) code = sv::kExitRequeued;
    events_.emit("requeue", sv::JsonObject()
                                .add("requeued", rq.requeued)
                                .add("exit_code", code)
                                .add("message", rq.message));
  }
  if (energy_ && energy_->stopped_early() && code == gpurun::energy::EnergyMonitor::kExitEarlyStop)
    print_err(fmt::format(
        "energy: the job was stopped early by its cost threshold (exit status {})", code));
  // A job that lost a rank to a boundary deadline says so in its final line, whatever its
  // exit status (docs/config.md#boundary).
  const std::string final_line = elastic_ ? elastic_->scheduler().final_line(code) : std::string();
  registration_.reset();
  elastic_.reset();
  energy_answers_.reset();  // it reads the monitor
  energy_.reset();          // restores any power limit it changed
  if (!plan_.run_dir.empty()) sv::remove_snapshot(plan_.run_dir);
  sv::release_run_dir(run_dir_, files_in_temp_);
  if (files_in_temp_) print_err(fmt::format("log files kept in {}", run_dir_.path));
  if (!final_line.empty()) print_err(final_line);
  // After a stop signal the console gets a moment to take the last lines; else gpurun waits
  // for its reader, as any program writing to a pipe does.
  if (supervisor_->shutdown_signal() != 0) console_writer_.stop(std::chrono::seconds(2));
  return code;
}

}  // namespace gpurun::app
