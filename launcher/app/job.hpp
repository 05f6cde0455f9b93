// gpurun::app::Job — one launch of a job on this node, from a checked Launch (launch_plan.hpp)
// to gpurun's exit status: it owns and wires every part (the store, the run directory, the
// supervisor and its spawners, the elastic controller, the energy monitor, the multi-node sync,
// the health check, the signal routing) and runs the io loop. Part of the composition root:
// job.cpp (the parts), job_nodes.cpp (several nodes), job_signals.cpp (signals).
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "app/auto_scale.hpp"
#include "app/energy_setup.hpp"
#include "app/launch_plan.hpp"
#include "control/config_watcher.hpp"
#include "control/dcgm_job_files.hpp"
#include "control/elastic_controller.hpp"
#include "control/metrics.hpp"
#include "control/status.hpp"
#include "control/status_spawner.hpp"
#include "energy/energy_answers.hpp"
#include "energy/monitor.hpp"
#include "gpurun/control/progress.hpp"
#include "gpurun/unique_fd.hpp"
#include "nodes/node_agent.hpp"
#include "nodes/node_sync.hpp"
#include "nodes/snapshot_transfer.hpp"
#include "store/backend_store.hpp"
#include "store/server.hpp"
#include "supervisor/asio_clock.hpp"
#include "supervisor/console.hpp"
#include "supervisor/console_writer.hpp"
#include "supervisor/event_log.hpp"
#include "supervisor/health_check.hpp"
#include "supervisor/notifier.hpp"
#include "supervisor/posix_spawner.hpp"
#include "supervisor/preemption.hpp"
#include "supervisor/run_dir.hpp"
#include "supervisor/supervisor.hpp"

namespace gpurun::app {

class Job {
 public:
  /// `console_writer`: gpurun's console (main's), given 2 s for its last lines after a stop
  /// signal.
  Job(Launch launch, supervisor::ConsoleWriter& console_writer);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  /// Runs the job to its end on this thread (the io loop) and returns gpurun's exit status
  /// (docs/errors.md#exit-status). Prints gpurun's own lines on stderr.
  int run();

 private:
  // job_nodes.cpp: --nnodes > 1 (docs/cli.md#multi-node).
  /// The node's multi-node options, c10d host placement, and for nodes > 0 the blocking join
  /// of node 0's store. An exit status when the job cannot start.
  std::optional<int> prepare_nodes();
  /// Node 0's sync over its store; failures, restarts and the root cause across nodes.
  void wire_nodes();
  /// "node R", or "this node" while a join-order rank is not given yet.
  std::string node_label() const;

  // job_agent.cpp: node k > 0 of an elastic job over several nodes (docs/cli.md#elastic-nodes).
  /// --config, --nnodes > 1 and not node 0: this gpurun is a slot agent.
  bool agent_mode() const;
  /// Before io runs: `work` on a thread of its own while this thread waits for a stop signal,
  /// which calls `cancel(sig)` (work then ends within about a second).
  void block_with_signals(const std::function<void()>& work,
                          const std::function<void(int sig)>& cancel);
  /// Connects to node 0's store and joins its job (node id, run id); an exit status when it
  /// cannot.
  std::optional<int> join_elastic();
  /// The local slots this node's config offers (active_gpus, else the first --nproc).
  std::vector<int> agent_offer() const;
  /// The supervisor's controller: the slot agent on the join's connections.
  void build_agent();
  /// Its exit status, and its config watcher (the offer).
  void wire_agent();
  /// Several nodes, elastic (docs/cli.md#elastic-nodes, "Pause and resume across nodes"): this
  /// gpurun's SnapshotServer on `address` and its SnapshotFetcher for `run_id`. Returns the
  /// endpoint the other nodes fetch from (`advertise`:port), "" (after a warning) when it
  /// cannot listen.
  std::string serve_snapshots(const std::string& address, const std::string& advertise,
                              const std::string& run_id);
  /// ElasticOptions::fetch_snapshot / NodeAgentOptions::fetch_snapshot: through
  /// snapshot_fetcher_.
  std::function<void(const std::string&, int64_t,
                     std::function<void(const gpurun::control::NodeEvent&)>)>
  snapshot_fetch();

  // job.cpp
  std::optional<int> open_store_and_run_dir();
  /// --simulate-gpus: the simulated GPUs' state file in the run dir, this process pointed at
  /// them (before any thread reads the environment). kExitUsage after saying why.
  std::optional<int> simulate_gpus();
  void announce();
  std::optional<int> build_supervisor();
  void wire_supervisor();
  std::optional<int> start_health_check();
  void wire_done();
  /// Node 0 of an elastic job over several nodes, at its end: every other node is told to exit
  /// with `exit_code`; `then` runs once they all disconnected, at most 5 s later.
  void end_nodes(int exit_code, std::function<void()> then);
  int run_to_end();
  int finish(int code);

  // job_metrics.cpp: /metrics and DCGM exporter's job files (docs/metrics.md).
  /// /metrics on --metrics-port's server and on the health check's; --dcgm-job-dir's files,
  /// kept current by a poll. An exit status when the server cannot listen.
  std::optional<int> start_metrics();
  /// What a scrape shows now. Io thread.
  gpurun::control::MetricsSnapshot metrics_snapshot();
  /// The DCGM job files of the GPUs the job holds now. Io thread.
  void update_dcgm_files();
  /// At the job's end: the metrics server closed, the DCGM job files removed.
  void stop_metrics();

  // job_signals.cpp: which part each signal goes to (the start rendezvous, the exit barrier,
  // the supervisor, the other nodes).
  void route_signals();

  Launch launch_;
  supervisor::ConsoleWriter& console_writer_;
  const supervisor::Options& opt_ = launch_.opt;
  const supervisor::EnvMap& inherited_ = launch_.inherited;
  supervisor::JobPlan& plan_ = launch_.plan;
  std::optional<control::Config>& config_ = launch_.config;
  const std::vector<int>& slot_ids_ = launch_.slot_ids;
  const std::vector<int>& launch_ids_ = launch_.launch_ids;
  const supervisor::FdLimit& fd_limit_ = launch_.fd_limit;
  const std::vector<std::string>& wargv_ = launch_.wargv;
  const std::vector<std::string>& store_hosts_ = launch_.store_hosts;
  const bool rank_by_join_ = launch_.rank_by_join;
  const std::string exe_ = launch_.wargv[0];  // the program's path, found on PATH
  const std::string display_name_ = launch_.opt.command.front();

  // The parts, in the order they are made (and so destroyed in reverse).
  boost::asio::io_context io_;
  std::unique_ptr<supervisor::NodeSync> node_sync_;
  supervisor::NodeSyncOptions node_opts_;
  boost::asio::signal_set signals_{io_};
  UniqueFd host_claim_;  // c10d: this host's claim to host the store
  supervisor::StopTiming stop_timing_;
  /// The event log's `resize` events counted for /metrics (its observer; outlives the log).
  gpurun::control::ResizeMetrics resize_metrics_;
  supervisor::EventLog events_;
  /// [notify] command: destroyed after the supervisor, so what is queued still runs.
  std::unique_ptr<supervisor::Notifier> notifier_;
  std::unique_ptr<store::Server> store_;
  supervisor::RunDir run_dir_;
  bool files_in_temp_ = false;
  std::unique_ptr<control::ProgressFile> progress_;
  std::unique_ptr<energy::EnergyMonitor> energy_;
  std::unique_ptr<AutoScale> auto_scale_;  // [energy] scale = "auto"
  bool monitor_energy_ = false;
  double job_start_s_ = 0;
  std::future<std::optional<DiscoveredGpus>> discovery_;
  /// [energy] settings, kept for when discovery is done (config is moved into the controller).
  std::optional<control::Config> energy_config_;
  supervisor::FdConsole console_;
  std::unique_ptr<supervisor::PosixSpawner> posix_spawner_;
  std::unique_ptr<control::StatusSpawner> status_spawner_;
  std::unique_ptr<supervisor::Supervisor> supervisor_;
  std::unique_ptr<control::ElasticController> elastic_;
  /// Node k > 0 of an elastic job: the command and event connections to node 0's store (until
  /// the agent takes them), the agent, and its config watcher.
  std::pair<std::unique_ptr<store::ClientStore>, std::unique_ptr<store::ClientStore>> agent_stores_;
  std::unique_ptr<supervisor::NodeAgent> agent_;
  std::unique_ptr<control::ConfigWatcher> agent_watcher_;
  std::unique_ptr<control::StatusWriter> agent_status_;  // a node > 0's own status.json
  std::unique_ptr<control::RunRegistration> registration_;
  supervisor::AsioClock clock_{io_};      // the status refresh's timer
  gpurun::Clock::Timer status_refresh_;   // destroyed before clock_ and io_
  std::function<void()> nodes_end_poll_;  // end_nodes
  gpurun::Clock::Timer nodes_end_timer_;
  std::function<void()> refresh_;
  std::unique_ptr<store::BackendStore> node0_store_;
  std::unique_ptr<supervisor::HealthCheckServer> health_;
  // Several nodes, elastic: the pause snapshot served to / fetched from the other nodes
  // (job_agent.cpp). The fetcher joins its threads before io_ goes.
  std::unique_ptr<supervisor::SnapshotServer> snapshot_server_;
  std::unique_ptr<supervisor::SnapshotFetcher> snapshot_fetcher_;
  // job_metrics.cpp
  gpurun::control::StepRate step_rate_;
  std::unique_ptr<supervisor::HealthCheckServer> metrics_server_;
  std::unique_ptr<gpurun::control::DcgmJobFiles> dcgm_files_;
  std::string dcgm_error_;  // the last failure said (said again only when it changes)
  std::function<void()> dcgm_poll_;
  gpurun::Clock::Timer dcgm_timer_;
  std::string rendezvous_error_;  // node 0: the start rendezvous failed
  int rendezvous_signal_ = 0;     // ... because of this signal
  std::function<void(const boost::system::error_code&, int)> on_signal_;
  // job_energy.cpp: the program's energy questions (rt.energy(), its windows, stop_reason's
  // detail), answered from the monitor; made with the controller, destroyed first.
  void start_energy_answers();
  std::string stop_fields() const;
  std::string early_stop_text_;  // the monitor's early-stop sentence
  std::unique_ptr<store::BackendStore> answers_store_;
  std::unique_ptr<energy::EnergyAnswers> energy_answers_;
};

}  // namespace gpurun::app
