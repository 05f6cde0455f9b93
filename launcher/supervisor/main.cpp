// gpurun — torchrun-compatible launcher that hosts the TCPStore and supervises
// one node's workers. Reference: docs/cli.md; error policy: docs/errors.md.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include "common/error.hpp"
#include "control/config.hpp"
#include "control/elastic_controller.hpp"
#include "control/status.hpp"
#include "control/status_spawner.hpp"
#include "store/server.hpp"
#include "supervisor/cli.hpp"
#include "supervisor/console.hpp"
#include "supervisor/event_log.hpp"
#include "supervisor/fd_limit.hpp"
#include "supervisor/gpu_inventory.hpp"
#include "supervisor/posix_spawner.hpp"
#include "supervisor/run_dir.hpp"
#include "supervisor/supervisor.hpp"
#include "supervisor/worker_command.hpp"
#include "supervisor/worker_env.hpp"

namespace {

namespace asio = boost::asio;
namespace sv = gpurun::supervisor;

constexpr int kExitLauncherError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNotFound = 127;

void print_err(const std::string& msg) {
  std::fprintf(stderr, "gpurun: %s\n", msg.c_str());
}

std::string random_uuid() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  uint64_t a = gen(), b = gen();
  a = (a & ~0xF000ull) | 0x4000ull;                         // version 4
  b = (b & 0x3FFFFFFFFFFFFFFFull) | 0x8000000000000000ull;  // variant 1
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xFFFF, a & 0xFFFF,
                     b >> 48, b & 0xFFFFFFFFFFFFull);
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

int run(int argc, char** argv) {
  // A vanished console reader must not kill the supervisor (workers reset this).
  ::signal(SIGPIPE, SIG_IGN);

  if (argc >= 2 && std::string_view(argv[1]) == "status")
    return gpurun::control::status_command(std::vector<std::string>(argv + 2, argv + argc));

  sv::Options opt;
  try {
    opt = sv::parse(argc, argv);
  } catch (const gpurun::UsageError& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitUsage;
  }
  if (opt.help) {
    std::fputs(sv::help_text().c_str(), stdout);
    return 0;
  }
  if (opt.version) {
    std::puts(sv::version_text().c_str());
    return 0;
  }

  const sv::EnvMap inherited = sv::current_environment();
  int gpus_counted = -1;  // nvidia-smi runs at most once
  const auto count_gpus = [&] {
    if (gpus_counted < 0) gpus_counted = sv::count_physical_gpus();
    return gpus_counted;
  };
  sv::JobPlan plan;
  try {
    plan = sv::make_plan(
        opt, inherited, count_gpus,
        [] { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); },
        random_uuid);
  } catch (const gpurun::UsageError& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitUsage;
  }

  // Elastic mode (--config): a bad initial config is a usage error naming file:line:col.
  // Slots (the ids active_gpus may name): with --device cuda every visible GPU, with
  // --device cpu the --nproc slots. --nproc only says which start while active_gpus is
  // absent: the first nproc (docs/config.md#active_gpus).
  std::optional<gpurun::control::Config> config;
  std::vector<int> slot_ids, launch_ids;
  for (int i = 0; i < plan.nproc; ++i) launch_ids.push_back(i);
  if (opt.config) {
    if (plan.nnodes != 1) {
      print_err("error: --config (elastic mode) supports a single node; got --nnodes " +
                std::to_string(plan.nnodes));
      return kExitUsage;
    }
    if (plan.device == sv::Device::kCuda) {
      const auto cvd = inherited.find("CUDA_VISIBLE_DEVICES");
      plan.gpu_ids = sv::slot_gpu_ids(
          cvd != inherited.end() ? std::optional<std::string>(cvd->second) : std::nullopt,
          count_gpus);
      plan.nproc = static_cast<int>(plan.gpu_ids.size());
      plan.world_size = plan.nproc;
    }
  }
  for (int i = 0; i < plan.nproc; ++i) slot_ids.push_back(i);
  if (opt.config) {
    try {
      config = gpurun::control::load_config(*opt.config, slot_ids);
    } catch (const gpurun::control::ConfigError& e) {
      print_err(fmt::format("error: {}", e.what()));
      return kExitUsage;
    }
  }

  // gpurun holds a few descriptors per worker: raise the soft limit, refuse what cannot fit.
  const sv::FdLimit fd_limit = sv::raise_fd_limit();
  try {
    sv::check_fd_budget(plan.nproc, opt.log_dir || opt.redirects.any() || opt.tee.any(), fd_limit);
  } catch (const gpurun::UsageError& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitUsage;
  }

  std::vector<std::string> wargv = sv::worker_argv(opt, inherited);
  const auto path_it = inherited.find("PATH");
  const auto exe = sv::find_executable(
      wargv[0], path_it != inherited.end() ? path_it->second : "/usr/local/bin:/usr/bin:/bin");
  if (!exe) {
    print_err(fmt::format("error: worker command '{}' not found or not executable", wargv[0]));
    return kExitNotFound;
  }
  if (const auto script = sv::missing_script(opt)) {
    print_err(fmt::format("error: worker script '{}' not found or not readable", *script));
    return kExitNotFound;
  }
  const std::string display_name = opt.command.front();
  wargv[0] = *exe;

  asio::io_context io;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.add(SIGUSR1);
  signals.add(SIGUSR2);
  signals.add(SIGHUP);

  sv::EventLog events;
  std::unique_ptr<gpurun::store::Server> store;
  sv::RunDir run_dir;
  try {
    if (opt.event_log) events = sv::EventLog(*opt.event_log);
    if (plan.node_rank == 0) {
      gpurun::store::ServerOptions so;
      if (!is_loopback(plan.master_addr)) so.hosts = {"::"};
      so.port = plan.master_port;
      so.log = [](const std::string& line) { print_err(line); };  // lines start "store: "
      store = std::make_unique<gpurun::store::Server>(io, std::move(so));
      plan.master_port = store->port();
    }
    if (!opt.log_dir) sv::remove_stale_run_dirs(sv::temp_run_base());  // left by kill -9
    run_dir = sv::make_run_dir(opt.log_dir, plan.run_id);
    plan.run_dir = run_dir.path;
  } catch (const gpurun::Error& e) {
    print_err(fmt::format("error: {}", e.what()));
    return kExitLauncherError;
  }

  const bool files_in_temp = run_dir.temporary && (opt.redirects.any() || opt.tee.any());
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
                           .add("executable", *exe));

  sv::SupervisorOptions so;
  so.plan = plan;
  so.argv = wargv;
  so.display_name = display_name;
  so.inherited = inherited;
  so.grace_period = opt.grace_period;
  so.keep_logs = opt.log_dir.has_value();
  so.redirects = opt.redirects;
  so.tee = opt.tee;
  so.ranks_filter = opt.ranks_filter;
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
    try {
      elastic = std::make_unique<gpurun::control::ElasticController>(
          io, store->backend(), supervisor, events, console, std::move(*config), eo);
    } catch (const gpurun::Error& e) {
      print_err(fmt::format("error: {}", e.what()));
      return kExitLauncherError;
    }
    supervisor.set_controller(elastic.get());
  }
  // Every run registers, so `gpurun status` finds it.
  registration = std::make_unique<gpurun::control::RunRegistration>(plan.run_id, plan.run_dir);
  if (!registration->error().empty()) print_err("warning: " + registration->error());
  supervisor.on_restart = [&](int) {
    if (store) store->reset_keyspace("gpurun/");
  };
  supervisor.on_done = [&](int) {
    boost::system::error_code ignored;
    signals.cancel(ignored);
    if (store) store->close();
    io.stop();
  };

  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        supervisor.handle_signal(sig);
        if (!supervisor.done()) signals.async_wait(on_signal);
      };
  signals.async_wait(on_signal);

  int code = kExitLauncherError;
  try {
    supervisor.start();
    if (!supervisor.done()) io.run();
    code = supervisor.done() ? supervisor.exit_code() : kExitLauncherError;
  } catch (const std::exception& e) {
    print_err(fmt::format("internal error: {}", e.what()));
    code = kExitLauncherError;
  }
  registration.reset();
  elastic.reset();
  if (!plan.run_dir.empty()) sv::remove_snapshot(plan.run_dir);
  sv::release_run_dir(run_dir, files_in_temp);
  if (files_in_temp) print_err(fmt::format("log files kept in {}", run_dir.path));
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
