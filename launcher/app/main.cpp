// gpurun — torchrun-compatible launcher that hosts the TCPStore and supervises
// one node's workers. Reference: docs/cli.md; error policy: docs/errors.md.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <future>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "app/auto_scale.hpp"
#include "app/energy_setup.hpp"
#include "app/launch_plan.hpp"
#include "app/start_checks.hpp"
#include "commands/subcommands.hpp"
#include "control/config.hpp"
#include "control/elastic_controller.hpp"
#include "control/status.hpp"
#include "control/status_spawner.hpp"
#include "energy/early_stop.hpp"
#include "energy/gpu_map.hpp"
#include "energy/monitor.hpp"
#include "energy/nvml.hpp"
#include "gpurun/abstract_lock.hpp"
#include "gpurun/control/progress.hpp"
#include "gpurun/env_names.hpp"
#include "gpurun/error.hpp"
#include "gpurun/unique_fd.hpp"
#include "store/backend.hpp"
#include "store/backend_store.hpp"
#include "store/server.hpp"
#include "supervisor/cli.hpp"
#include "supervisor/console.hpp"
#include "supervisor/console_writer.hpp"
#include "supervisor/event_log.hpp"
#include "supervisor/fd_limit.hpp"
#include "supervisor/gpu_inventory.hpp"
#include "supervisor/health_check.hpp"
#include "supervisor/master_address.hpp"
#include "supervisor/node_sync.hpp"
#include "supervisor/notifier.hpp"
#include "supervisor/posix_spawner.hpp"
#include "supervisor/preemption.hpp"
#include "supervisor/run_dir.hpp"
#include "supervisor/slurm.hpp"
#include "supervisor/supervisor.hpp"
#include "supervisor/worker_command.hpp"
#include "supervisor/worker_env.hpp"

using namespace gpurun::app;  // energy_setup.hpp

namespace {

namespace asio = boost::asio;
namespace sv = gpurun::supervisor;

using gpurun::app::print_err;

int run(int argc, char** argv) {
  // A vanished console reader must not kill the supervisor (workers reset this), nor a file
  // size limit (RLIMIT_FSIZE): a log write then fails with EFBIG, which gpurun reports.
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);

  if (const std::optional<int> code = gpurun::commands::run_subcommand(argc, argv)) return *code;

  // gpurun's own output goes through writer threads: a console nobody reads (a paused pager,
  // Ctrl-S) never stalls supervision, heartbeats or signal handling (docs/cli.md#console).
  sv::ConsoleWriter console_writer({});
  sv::ConsoleWriter::install(&console_writer);

  const std::variant<Launch, int> prepared = prepare_launch(argc, argv);
  if (const int* code = std::get_if<int>(&prepared)) return *code;
  Launch launch = std::get<Launch>(prepared);
  const sv::Options& opt = launch.opt;
  const sv::EnvMap& inherited = launch.inherited;
  sv::JobPlan& plan = launch.plan;
  std::optional<gpurun::control::Config>& config = launch.config;
  const std::vector<int>& slot_ids = launch.slot_ids;
  const std::vector<int>& launch_ids = launch.launch_ids;
  const sv::FdLimit& fd_limit = launch.fd_limit;
  const std::vector<std::string>& wargv = launch.wargv;
  const std::vector<std::string>& store_hosts = launch.store_hosts;
  const bool rank_by_join = launch.rank_by_join;
  const std::string exe = wargv[0];  // the program's path, found on PATH
  const std::string display_name = opt.command.front();

  asio::io_context io;
  // --nnodes > 1 (docs/cli.md#multi-node): nodes > 0 join node 0's store before anything
  // else — node 0 starts the job once every node joined; its run id and --max-restarts hold
  // for every node. (Blocking, before gpurun handles signals: Ctrl-C ends it as usual.)
  std::unique_ptr<sv::NodeSync> node_sync;
  sv::NodeSyncOptions node_opts;
  if (plan.nnodes > 1) {
    node_opts.nnodes = plan.nnodes;
    node_opts.node_rank = plan.node_rank;
    node_opts.nproc = plan.nproc;
    node_opts.host = plan.master_addr;
    node_opts.port = plan.master_port;
    node_opts.run_id = plan.run_id;
    node_opts.max_restarts = plan.max_restarts;
    node_opts.barrier_timeout = opt.exit_barrier_timeout;
    node_opts.join_timeout = opt.join_timeout;
    node_opts.heartbeat_timeout = opt.node_timeout;
    node_opts.say = [](const std::string& line) { print_err(line); };
    if (rank_by_join) {
      node_opts.nnodes = opt.nnodes;
      node_opts.nnodes_max = opt.nnodes_max;
      node_opts.rank_by_join = true;
      node_opts.check_run_id = opt.run_id_given;
      node_opts.last_call_timeout = opt.last_call_timeout;
    }
  }
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.add(SIGUSR1);
  signals.add(SIGUSR2);
  signals.add(SIGHUP);
  signals.add(SIGQUIT);  // stops the job like SIGTERM (torchrun's agent does the same)
  if (opt.preempt_signal != 0 && opt.preempt_signal != SIGUSR1 && opt.preempt_signal != SIGUSR2)
    signals.add(opt.preempt_signal);  // --preempt-signal (docs/cli.md#preemption)
  // c10d by join order: host candidates on one machine contend for @gpurun-c10d/<port> (held
  // for the process's life). The first hosts; the others, and a candidate that finds the port
  // taken by another program, join (torchrun's c10d backend falls back to a client too),
  // unless --rdzv-conf is_host=1 says it must host.
  gpurun::UniqueFd host_claim;
  if (rank_by_join && plan.node_rank == 0 && !opt.is_host.value_or(false)) {
    host_claim = gpurun::UniqueFd(
        gpurun::take_abstract_lock(fmt::format("gpurun-c10d/{}", plan.master_port)));
    if (!host_claim || sv::port_in_use(plan.master_port)) {
      plan.node_rank = node_opts.node_rank = 1;  // another process hosts: join it
      print_err(fmt::format(
          "the store's port {} is taken on this host: joining the node that listens there",
          plan.master_port));
    }
  }
  const auto node_label = [&] {  // node_rank() < 0: a join-order rank not given yet
    return node_sync && node_sync->node_rank() < 0
               ? std::string("this node")
               : fmt::format("node {}", node_sync ? node_sync->node_rank() : plan.node_rank);
  };
  if (plan.nnodes > 1 && plan.node_rank > 0) {
    // The join blocks on its own thread; this one handles signals meanwhile (a stop signal
    // ends the join within about a second, exit 128 + signal).
    node_sync = std::make_unique<sv::NodeSync>(io, node_opts);
    std::optional<sv::JobStart> joined;
    std::exception_ptr join_error;
    auto guard = asio::make_work_guard(io);
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (!ec && (sig == SIGINT || sig == SIGTERM || sig == SIGQUIT)) node_sync->cancel_join(sig);
    });
    std::thread joiner([&] {
      try {
        joined = node_sync->join();
      } catch (...) {
        join_error = std::current_exception();
      }
      asio::post(io, [&] {
        boost::system::error_code ignored;
        signals.cancel(ignored);
        guard.reset();
      });
    });
    io.run();
    joiner.join();
    io.restart();
    try {
      if (join_error) std::rethrow_exception(join_error);
      const sv::JobStart& js = *joined;
      if (js.max_restarts != plan.max_restarts)
        print_err(fmt::format(
            "warning: node 0 runs with --max-restarts {}, this node was given {}: node 0 decides "
            "restarts for the whole job, so {} holds",
            js.max_restarts, plan.max_restarts, js.max_restarts));
      plan.run_id = js.run_id;
      plan.max_restarts = js.max_restarts;
      plan.node_rank = js.node_rank;  // c10d: given in join order
      plan.nnodes = js.nnodes;        // --nnodes MIN:MAX: as node 0 closed the rendezvous
      plan.world_size = plan.nproc * plan.nnodes;
    } catch (const sv::JoinError& e) {  // (node_label: the rank join() gave, if any)
      print_err(fmt::format("error: {}: {}", node_label(), e.what()));
      return e.code;
    } catch (const gpurun::Error& e) {
      print_err(fmt::format("error: {}: {}", node_label(), e.what()));
      return kExitLauncherError;
    }
  }
  // Preemption timing: under Slurm the defaults fit inside KillWait.
  const sv::StopTiming stop_timing = sv::stop_timing(opt, inherited);
  if (!stop_timing.note.empty()) print_err(stop_timing.note);

  sv::EventLog events;
  // [notify] command (docs/sharing.md#notifications): every notable event, from any part of
  // gpurun, through the event log. Destroyed after the supervisor: what is queued still runs.
  std::unique_ptr<sv::Notifier> notifier;
  if (config && !config->notify.command.empty()) {
    notifier = std::make_unique<sv::Notifier>(
        config->notify.command, config->notify.timeout,
        [](const std::string& line) { print_err("warning: " + line); });
  }
  const auto observe = [&notifier](sv::EventLog& log) {
    if (notifier)
      log.set_observer([n = notifier.get()](std::string_view event, const std::string& record) {
        n->post(event, record);
      });
  };
  observe(events);
  std::unique_ptr<gpurun::store::Server> store;
  sv::RunDir run_dir;
  try {
    if (opt.event_log) {
      events = sv::EventLog(*opt.event_log);
      observe(events);
    }
    if (plan.node_rank == 0) {
      gpurun::store::ServerOptions so;
      so.hosts = store_hosts;
      so.port = plan.master_port;
      so.free_port_if_busy = sv::may_take_free_port(plan.nnodes, opt.master_port_given,
                                                    inherited.count("MASTER_PORT") != 0);
      if (opt.store_memory_budget) so.memory_budget_bytes = *opt.store_memory_budget;
      so.log = [](const std::string& line) { print_err(line); };  // lines start "store: "
      store = std::make_unique<gpurun::store::Server>(io, std::move(so));
      if (plan.nnodes > 1 && plan.master_port == 0)
        print_err(
            fmt::format("node 0's store listens on port {}: start the other nodes with "
                        "--master-port {}",
                        store->port(), store->port()));
      if (plan.master_port != 0 && store->port() != plan.master_port)  // busy; nobody chose it
        print_err(sv::free_port_note(plan.master_port, store_hosts.front(), store->port()));
      plan.master_port = store->port();
    }
    if (!opt.log_dir) sv::remove_stale_run_dirs(sv::temp_run_base());  // left by kill -9
    run_dir = sv::make_run_dir(opt.log_dir, plan.run_id);
    plan.run_dir = run_dir.path;
    {  // the worker engine's C library of this gpurun, for the Python package
      std::error_code ec_self;
      const auto self = std::filesystem::read_symlink("/proc/self/exe", ec_self);
      if (!ec_self) plan.worker_library = sv::find_worker_library(self.string());
    }
  } catch (const gpurun::Error& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitLauncherError;
  }

  const bool files_in_temp = run_dir.temporary && (opt.redirects.any() || opt.tee.any());
  console_writer.set_drop_hint(opt.log_dir || files_in_temp
                                   ? fmt::format("the log files under {} have them", run_dir.path)
                                   : std::string("--log-dir keeps every worker line in files"));
  if (opt.log_dir)
    print_err(fmt::format("logs: {}", run_dir.path));
  else if (files_in_temp)
    print_err(fmt::format(
        "warning: --redirects/--tee without --log-dir: the log files go to {} (kept after exit)",
        run_dir.path));
  if (plan.set_omp_num_threads)
    print_err(
        fmt::format("setting OMP_NUM_THREADS=1 for each of the {} workers to avoid overloading the "
                    "machine; set OMP_NUM_THREADS yourself to tune it",
                    launch_ids.size()));

  events.emit("start", sv::JsonObject()
                           .add("run_id", plan.run_id)
                           .add("nproc", static_cast<int64_t>(launch_ids.size()))
                           .add("slots", plan.nproc)
                           .add("world_size", plan.world_size)
                           .add("node_rank", plan.node_rank)
                           .add("master_addr", plan.master_addr)
                           .add("master_port", static_cast<int>(plan.master_port))
                           .add("max_restarts", plan.max_restarts)
                           .add("cmd", opt.command)
                           .add("executable", exe));

  // Energy (docs/energy.md): the workers' step progress file, then the monitor.
  std::unique_ptr<gpurun::control::ProgressFile> progress;
  std::unique_ptr<gpurun::energy::EnergyMonitor> energy;
  std::unique_ptr<gpurun::app::AutoScale> auto_scale;  // [energy] scale = "auto"
  if (config) {
    try {
      progress =
          std::make_unique<gpurun::control::ProgressFile>(plan.run_dir + "/progress", plan.nproc);
    } catch (const gpurun::Error& e) {
      print_err(
          fmt::format("warning: {} (no step progress for the power-limit profiler)", e.what()));
    }
  }
  // NVML and CUDA initialise on their own thread while the workers start (it can take ~1 s).
  const bool monitor_energy = energy_wanted(opt, plan, config);
  const double job_start_s = gpurun::energy::EnergyMonitor::now_s();
  std::future<std::optional<DiscoveredGpus>> discovery;
  if (monitor_energy)
    discovery = std::async(std::launch::async, discover_gpus, std::cref(inherited),
                           config ? slot_ids : launch_ids);
  // [energy] settings, kept for when discovery is done (config is moved into the controller).
  const std::optional<gpurun::control::Config> energy_config = config;

  sv::SupervisorOptions so;
  so.plan = plan;
  so.argv = wargv;
  so.display_name = display_name;
  so.inherited = inherited;
  if (progress) so.inherited[gpurun::env::kProgressFile] = progress->path();
  so.grace_period = stop_timing.grace_period;
  so.stop_timeout = stop_timing.stop_timeout;
  so.preempt_signal = opt.preempt_signal;
  so.stop_on_preempt = opt.requeue;
  so.keep_logs = opt.log_dir.has_value();
  so.redirects = opt.redirects;
  so.tee = opt.tee;
  so.ranks_filter = opt.ranks_filter;
  so.local_ranks_filter = opt.local_ranks_filter;
  so.prefix_template = opt.log_line_prefix_template;

  sv::FdConsole console;
  sv::PosixSpawner posix_spawner(io, sv::PosixSpawnerOptions{fd_limit.original});
  // Plain runs keep status.json through the spawner; elastic runs through their controller.
  std::unique_ptr<gpurun::control::StatusSpawner> status_spawner;
  if (!config) {
    gpurun::control::StatusSnapshot snap;
    snap.run_id = plan.run_id;
    snap.run_dir = plan.run_dir;
    snap.supervisor_pid = static_cast<int>(::getpid());
    snap.physical_gpus = plan.gpu_ids;
    if (monitor_energy)
      snap.energy = [&energy] {
        return energy ? energy_status(*energy) : gpurun::control::EnergyStatus{};
      };
    status_spawner = std::make_unique<gpurun::control::StatusSpawner>(io, posix_spawner, console,
                                                                      plan.nproc, std::move(snap));
  }
  sv::ProcessSpawner& spawner =
      status_spawner ? static_cast<sv::ProcessSpawner&>(*status_spawner) : posix_spawner;
  sv::Supervisor supervisor(io, so, spawner, console, events);
  std::unique_ptr<gpurun::control::ElasticController> elastic;
  std::unique_ptr<gpurun::control::RunRegistration> registration;
  if (config) {
    gpurun::control::ElasticOptions eo;
    eo.config_path = std::filesystem::absolute(*opt.config);
    eo.slots = slot_ids;
    eo.launch = launch_ids;
    eo.physical_gpus = plan.gpu_ids;
    eo.run_id = plan.run_id;
    eo.run_dir = plan.run_dir;
    if (monitor_energy)
      eo.energy_status = [&energy] {
        return energy ? energy_status(*energy) : gpurun::control::EnergyStatus{};
      };
    try {
      elastic = std::make_unique<gpurun::control::ElasticController>(
          io, store->backend(), supervisor, events, console, std::move(*config), eo);
    } catch (const gpurun::Error& e) {
      print_err(fmt::format("error: {}", e.what()));
      return kExitLauncherError;
    }
    supervisor.set_controller(elastic.get());
    if (monitor_energy) {
      // The monitor may not exist yet (or ever: no NVML): every hook checks.
      gpurun::control::EnergyHooks hooks;
      hooks.active_changed = [&energy, &elastic](const std::vector<int>& active) {
        if (energy) energy->set_active(active, elastic->scheduler().generation());
      };
      hooks.boundary =
          [&energy](const gpurun::control::BoundaryInfo& b) -> std::optional<std::string> {
        if (!energy) return std::nullopt;
        const double t = b.time_ms > 0 ? static_cast<double>(b.time_ms) / 1000.0
                                       : gpurun::energy::EnergyMonitor::now_s();
        energy->close_window(t, b.step == 0 ? "epoch" : "steps", b.generation, b.epoch, b.step);
        if (b.step != 0) return std::nullopt;
        return energy->end_epoch(b.epoch);
      };
      hooks.training_finished = [&energy](int64_t final_epoch) {
        if (!energy) return;
        energy->close_window(gpurun::energy::EnergyMonitor::now_s(), "epoch", -1, final_epoch, 0);
        energy->end_epoch(final_epoch, /*may_stop=*/false);  // training is over: no stop
      };
      elastic->set_energy_hooks(std::move(hooks));
    }
  }
  // status.json's energy columns change without protocol events: refresh it every second.
  asio::steady_timer status_refresh(io);
  std::function<void(const boost::system::error_code&)> refresh =
      [&](const boost::system::error_code& ec) {
        if (ec || supervisor.done()) return;
        if (elastic) elastic->publish_status();
        if (status_spawner) status_spawner->publish_status();
        status_refresh.expires_after(std::chrono::seconds(1));
        status_refresh.async_wait(refresh);
      };
  if (monitor_energy) {
    status_refresh.expires_after(std::chrono::seconds(1));
    status_refresh.async_wait(refresh);
  }
  // Every run registers, so `gpurun status` finds it.
  registration = std::make_unique<gpurun::control::RunRegistration>(plan.run_id, plan.run_dir);
  if (!registration->error().empty()) print_err("warning: " + registration->error());
  supervisor.on_restart = [&](int attempt) {
    // Multi-node: node 0's NodeSync reset the store before it told the nodes to restart.
    if (store && !node_sync) store->reset_keyspace("gpurun/");
    if (energy) energy->restart(attempt);
  };
  // An early stop by the energy monitor: every worker exited 0, gpurun exits 3.
  supervisor.final_status = [&](int exit_code) -> std::optional<std::pair<int, std::string>> {
    if (!energy || !energy->stopped_early() || exit_code != 0) return std::nullopt;
    return std::make_pair(int{gpurun::energy::EnergyMonitor::kExitEarlyStop},
                          std::string("stopped early by the energy cost threshold"));
  };
  // --nnodes > 1: a failure anywhere stops every node; node 0 decides each attempt's end for
  // the whole job (restart or exit, the root cause) and keeps its store up until every node
  // is done (the exit barrier). docs/cli.md#multi-node.
  std::unique_ptr<gpurun::store::BackendStore> node0_store;
  if (plan.nnodes > 1 && store) {
    node0_store = std::make_unique<gpurun::store::BackendStore>(store->backend());
    node_sync = std::make_unique<sv::NodeSync>(io, node_opts, *node0_store);
  }
  if (node_sync) {
    node_sync->on_peer_failure = [&supervisor](const std::string& why, int sig) {
      if (sig != 0)
        supervisor.peer_signal(sig, why);
      else
        supervisor.stop_for_peer(why);
    };
    node_sync->on_root_cause = [&events](int attempt, const sv::NodeFailure& root) {
      // A node's own failure ("node 1 (host)'s gpurun disconnected …") names its node, a
      // worker's ("rank 2 (pid 123) ended with …") its rank: each is said once.
      print_err(fmt::format(
          "root cause of attempt {} (first failure in time, of every node): {}", attempt,
          root.rank >= 0
              ? fmt::format("node {}, local rank {}: {}", root.node, root.local_rank, root.reason)
              : root.reason));
      events.emit("root_cause", sv::JsonObject()
                                    .add("attempt", attempt)
                                    .add("node", root.node)
                                    .add("rank", root.rank)
                                    .add("local_rank", root.local_rank)
                                    .add("code", root.code)
                                    .add("reason", root.reason));
    };
    supervisor.on_attempt_start = [&node_sync](int attempt) {
      node_sync->attempt_started(attempt);
    };
    supervisor.on_failure = [&node_sync](const sv::Supervisor::LocalFailure& f) {
      sv::NodeFailure nf;
      nf.rank = f.rank;
      nf.local_rank = f.local_rank;
      nf.code = f.code;
      nf.reason = f.reason;
      node_sync->local_failure(f.attempt, nf);
    };
    supervisor.attempt_gate = [&](int attempt, int code, bool by_signal,
                                  sv::Supervisor::AttemptDecision decide) {
      const auto then = [&, decide](const sv::AttemptOutcome& out) {
        if (out.restart && out.nnodes > 0) {  // re-formed with the nodes left (--nnodes MIN:MAX)
          plan.node_rank = out.node_rank;
          plan.nnodes = out.nnodes;
          plan.world_size = plan.nproc * plan.nnodes;
          supervisor.set_node(out.node_rank, out.nnodes);
        }
        decide(out.restart, out.code, out.reason);
      };
      node_sync->attempt_ended(attempt, code, by_signal, then);
    };
  }
  // torchrun's TORCHELASTIC_HEALTH_CHECK_PORT (docs/cli.md#health-check): 200 while the job
  // runs, 503 once it stops or ended.
  std::unique_ptr<sv::HealthCheckServer> health;
  if (const auto hc = inherited.find("TORCHELASTIC_HEALTH_CHECK_PORT"); hc != inherited.end()) {
    try {
      health = std::make_unique<sv::HealthCheckServer>(
          io, sv::health_check_port(hc->second), [&supervisor, &plan, job_start_s] {
            const bool stopping = supervisor.shutdown_signal() != 0;
            const bool done = supervisor.done();
            sv::Health h;
            h.alive = !done && !stopping;
            h.json = sv::JsonObject()
                         .add("alive", h.alive)
                         .add("state", done       ? "done"
                                       : stopping ? "stopping"
                                                  : "running")
                         .add("run_id", plan.run_id)
                         .add("node_rank", plan.node_rank)
                         .add("attempt", supervisor.attempt())
                         .add("workers", static_cast<int64_t>(supervisor.worker_pids().size()))
                         .add("uptime_s", gpurun::energy::EnergyMonitor::now_s() - job_start_s)
                         .str();
            return h;
          });
      print_err(fmt::format("health check: http://127.0.0.1:{}/ (TORCHELASTIC_HEALTH_CHECK_PORT)",
                            health->port()));
    } catch (const gpurun::UsageError& e) {  // torchrun's agent logs it and goes on: so do we
      print_err(fmt::format("warning: {}; no health check server is started", e.what()));
    } catch (const gpurun::Error& e) {
      print_err(fmt::format("error: {}", e.what()));
      return kExitLauncherError;
    }
  }
  supervisor.on_done = [&](int exit_code) {
    status_refresh.cancel();
    if (health) health->close();
    if (energy) energy->finish(exit_code);
    if (auto_scale) auto_scale->finish();
    const auto close_store = [&] {
      boost::system::error_code ignored;
      signals.cancel(ignored);
      if (store) store->close();
      io.stop();
    };
    if (node_sync) {  // node 0: until the other nodes have read the decision
      node_sync->finish(close_store);
      return;
    }
    close_store();
  };

  std::string rendezvous_error;  // node 0: the start rendezvous failed
  int rendezvous_signal = 0;     // ... because of this signal
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        const bool stop = sig == SIGINT || sig == SIGTERM || sig == SIGQUIT;
        if (node_sync && node_sync->rendezvous_pending()) {  // no worker runs yet
          if (stop) {
            rendezvous_signal = sig;
            node_sync->cancel_rendezvous(
                fmt::format("node 0 received {} during the start rendezvous", sv::signal_name(sig)),
                128 + sig);
            return;
          }
        } else if (node_sync && node_sync->waiting()) {  // the other nodes' end is awaited
          if (stop) node_sync->interrupt(sig);
        } else {
          // Several nodes: the others stop the same way (e.g. SIGTERM: at their next boundary).
          if (node_sync && stop && !supervisor.done())
            node_sync->local_signal(supervisor.attempt(), sig);
          supervisor.handle_signal(sig);
        }
        if (!supervisor.done()) signals.async_wait(on_signal);
      };
  // Added here, not with the others: the join above waits for a stop signal only once.
  signals.add(SIGWINCH);  // a resized terminal: the workers' pseudo-terminals follow
  signals.async_wait(on_signal);

  int code = kExitLauncherError;
  try {
    if (node_sync && store) {  // node 0: every node joins before any worker starts
      node_sync->rendezvous([&](const std::string& error) {
        if (error.empty()) {
          plan.nnodes = node_sync->nnodes();  // --nnodes MIN:MAX: as the rendezvous closed
          plan.world_size = plan.nproc * plan.nnodes;
          supervisor.set_node_count(plan.nnodes);
          supervisor.start();
          return;
        }
        rendezvous_error = error;
        boost::system::error_code ignored;
        signals.cancel(ignored);
        node_sync->finish([&] {  // the joined nodes read the error first
          store->close();
          io.stop();
        });
      });
    } else {
      supervisor.start();
    }
    if (discovery.valid()) {
      // The workers are starting; the monitor begins with the job's start time.
      std::optional<DiscoveredGpus> found = discovery.get();
      if (!found && opt.energy_summary)
        print_err(fmt::format("energy: no summary will be written to {}: monitoring is off",
                              *opt.energy_summary));
      if (found && !supervisor.done()) {
        energy = make_energy_monitor(io, events, opt, energy_config, std::move(*found), exe,
                                     progress.get(), job_start_s);
        energy->set_active(elastic ? elastic->scheduler().active() : launch_ids);
        // [policy] yield_to_foreign (docs/sharing.md#yield): NVML's process lists of the job's
        // GPUs, each second; the controller decides (a reload may turn the policy on or off).
        if (elastic)
          energy->set_process_hook(
              [&elastic](std::map<int, std::vector<gpurun::energy::Nvml::Process>> found) {
                gpurun::control::ForeignGpus::Listing listing;
                for (const auto& [slot, procs] : found) {
                  auto& l = listing[slot];  // an empty list too: the GPU was read, and is free
                  for (const auto& p : procs) l.emplace_back(p.pid, p.used_bytes);
                }
                if (elastic) elastic->on_gpu_processes(listing);
              });
        if (energy_config && energy_config->energy.auto_scale) {
          auto_scale = make_auto_scale(
              events, [](const std::string& line) { print_err(line); }, elastic.get(), *energy,
              *energy_config);
          if (auto_scale)
            energy->set_epoch_hook(
                [&auto_scale](const gpurun::energy::EpochRecord& rec, bool may_stop) {
                  if (auto_scale && may_stop) auto_scale->on_epoch(rec);
                });
        }
      }
    }
    if (energy_config && energy_config->energy.auto_scale && !energy)
      print_err(
          "energy: warning: [energy] scale = \"auto\" needs the GPU energy monitor (NVML), "
          "which is off: the job keeps its GPUs");
    if (energy_config && energy_config->policy.yield_to_foreign && !energy)
      print_err(
          "warning: [policy] yield_to_foreign needs the GPU energy monitor (NVML), "
          "which is off: no GPU is yielded");
    if (!supervisor.done() || node_sync) io.run();
    if (energy) energy->set_epoch_hook({});  // the job is over: scale decides nothing more
    code = supervisor.done() ? supervisor.exit_code() : kExitLauncherError;
    if (!rendezvous_error.empty()) {
      print_err(fmt::format("error: {}", rendezvous_error));
      code = rendezvous_signal ? 128 + rendezvous_signal : kExitLauncherError;
    }
  } catch (const std::exception& e) {
    print_err(fmt::format("internal error: {}", e.what()));
    code = kExitLauncherError;
  }
  // --requeue after a stop by SIGTERM or the preempt signal (docs/cli.md#preemption); with
  // several nodes node 0 alone requeues the job (once for every node).
  if (opt.requeue && plan.node_rank == 0 && supervisor.done() &&
      supervisor.shutdown_signal() != 0 &&
      (supervisor.shutdown_signal() == SIGTERM ||
       supervisor.shutdown_signal() == opt.preempt_signal)) {
    const sv::RequeueResult rq = sv::requeue_job(inherited);
    print_err(rq.message);
    if (rq.requeued) code = sv::kExitRequeued;
    events.emit("requeue", sv::JsonObject()
                               .add("requeued", rq.requeued)
                               .add("exit_code", code)
                               .add("message", rq.message));
  }
  if (energy && energy->stopped_early() && code == gpurun::energy::EnergyMonitor::kExitEarlyStop)
    print_err(fmt::format(
        "energy: the job was stopped early by its cost threshold (exit status {})", code));
  // A job that lost a rank to a boundary deadline says so in its final line, whatever its
  // exit status (docs/config.md#boundary).
  const std::string final_line = elastic ? elastic->scheduler().final_line(code) : std::string();
  registration.reset();
  elastic.reset();
  energy.reset();  // restores any power limit it changed
  if (!plan.run_dir.empty()) sv::remove_snapshot(plan.run_dir);
  sv::release_run_dir(run_dir, files_in_temp);
  if (files_in_temp) print_err(fmt::format("log files kept in {}", run_dir.path));
  if (!final_line.empty()) print_err(final_line);
  // After a stop signal the console gets a moment to take the last lines; else gpurun waits
  // for its reader, as any program writing to a pipe does.
  if (supervisor.shutdown_signal() != 0) console_writer.stop(std::chrono::seconds(2));
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
