// gpurun's flag table (docs/cli.md): one function per concern, each adding its flags' setters.
// parse() (cli.cpp) walks the command line and torchrun's PET_* variables over this table.
#include <cctype>
#include <csignal>
#include <limits>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "cli/cli.hpp"
#include "cli/cli_flags.hpp"
#include "gpurun/error.hpp"
#include "supervisor/preemption.hpp"

namespace gpurun::supervisor::cli {
namespace {

constexpr auto kMaxInt = std::numeric_limits<int>::max();

std::chrono::milliseconds seconds_conf(std::string_view key, std::string_view v) {
  return detail::seconds_flag(fmt::format("rdzv-conf {}", key), v);
}

std::set<int> ranks_list(std::string_view f, std::string_view v) {
  constexpr std::string_view kWant = "a comma-separated list of ranks like 0,3";
  std::set<int> ranks;
  const auto items = detail::split(v, ',');
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (detail::trim(items[k]).empty())
      throw UsageError(fmt::format("invalid value '{}' for --{}: piece {} is empty; expected {}", v,
                                   f, k + 1, kWant));
    const auto rank = detail::to_int(detail::trim(items[k]), 0, std::numeric_limits<int>::max());
    if (!rank)
      throw UsageError(fmt::format(
          "invalid value '{}' for --{}: piece {} ('{}') is not a rank (an integer >= 0); "
          "expected {}",
          v, f, k + 1, detail::trim(items[k]), kWant));
    ranks.insert(static_cast<int>(*rank));
  }
  return ranks;
}

/// A flag of torchrun's that gpurun refuses, saying why.
Setter refused(std::string why) {
  return [why = std::move(why)](std::string_view f, std::string_view) {
    throw UsageError(fmt::format("--{}: {}", f, why));
  };
}

/// A value that must not be empty, kept as given (a std::string or std::optional<string>).
template <typename Into>
Setter text_into(Into& into, std::string_view want) {
  return [&into, want](std::string_view f, std::string_view v) {
    if (v.empty()) detail::bad_value(f, v, want);
    into = std::string(v);
  };
}

/// How many workers, on how many nodes, and where node 0's store listens.
void add_node_flags(FlagTable& t, Options& o) {
  const Setter nproc = [&](std::string_view f, std::string_view v) {
    o.nproc_given = true;
    if (v == "auto") {
      o.nproc_mode = NprocMode::kAuto;
    } else if (v == "gpu") {
      o.nproc_mode = NprocMode::kGpu;
    } else if (v == "cpu") {
      o.nproc_mode = NprocMode::kCpu;
    } else {
      o.nproc_mode = NprocMode::kCount;
      o.nproc = detail::int_flag(f, v, 1, 1 << 20, "a positive integer, auto, gpu or cpu");
    }
  };
  t.insert({
      {"nproc", {true, nproc, "", "nproc-per-node"}},
      {"nproc-per-node", {true, nproc, "PET_NPROC_PER_NODE"}},
      {"nnodes",
       {true,
        [&](std::string_view f, std::string_view v) {
          constexpr std::string_view kWant = "a positive integer N or a range MIN:MAX";
          auto parts = detail::split(v, ':');
          if (parts.size() > 2) detail::bad_value(f, v, kWant);
          for (const auto piece : parts)
            if (!detail::to_int(piece, 1, kMaxInt)) detail::bad_value(f, v, kWant);
          const int lo = detail::int_flag(f, parts[0], 1, kMaxInt, kWant);
          const int hi = parts.size() == 2 ? detail::int_flag(f, parts[1], 1, kMaxInt, kWant) : lo;
          if (hi < lo)
            throw UsageError(
                fmt::format("invalid value '{}' for --{}: the maximum {} is below the minimum {}",
                            v, f, hi, lo));
          o.nnodes = lo;
          o.nnodes_max = hi;
          o.nnodes_given = true;
        },
        "PET_NNODES"}},
      {"node-rank",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.node_rank = detail::int_flag(f, v, 0, kMaxInt, "a non-negative integer");
          o.node_rank_given = true;
        },
        "PET_NODE_RANK"}},
      {"master-addr",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v.empty()) detail::bad_value(f, v, "a host name or address");
          o.master_addr = std::string(v);
          o.master_addr_given = true;
        },
        "PET_MASTER_ADDR"}},
      {"master-port",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.master_port =
              static_cast<uint16_t>(detail::int_flag(f, v, 0, 65535, "a port number 0-65535"));
          o.master_port_given = true;
        },
        "PET_MASTER_PORT"}},
      {"local-addr", {true, text_into(o.local_addr, "a host name or address"), "PET_LOCAL_ADDR"}},
      {"standalone",
       {false, [&](std::string_view, std::string_view) { o.standalone = true; }, "PET_STANDALONE"}},
      {"slurm",
       {false,
        [&](std::string_view, std::string_view) {
          if (o.slurm == SlurmMode::kOff)
            throw UsageError("--slurm and --no-slurm cannot be combined");
          o.slurm = SlurmMode::kOn;
        }}},
      {"no-slurm",
       {false,
        [&](std::string_view, std::string_view) {
          if (o.slurm == SlurmMode::kOn)
            throw UsageError("--slurm and --no-slurm cannot be combined");
          o.slurm = SlurmMode::kOff;
        }}},
  });
}

/// The rendezvous: its backend, endpoint, settings, run id and timeouts.
void add_rendezvous_flags(FlagTable& t, Options& o) {
  const Setter run_id = [&](std::string_view f, std::string_view v) {
    if (auto problem = detail::run_id_problem(v)) {
      std::string shown;  // control characters shown as \xNN
      for (unsigned char c : v)
        shown += c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, c);
      throw UsageError(fmt::format("invalid value '{}' for --{}: {}", shown, f, *problem));
    }
    o.run_id = std::string(v);
    o.run_id_given = true;
  };
  t.insert({
      {"rdzv-backend",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v == "static") {
            o.rdzv_backend = RdzvBackend::kStatic;
          } else if (v == "c10d") {
            o.rdzv_backend = RdzvBackend::kC10d;
          } else if (v == "etcd" || v == "etcd-v2") {
            throw UsageError(fmt::format(
                "--{} {}: gpurun hosts the rendezvous store itself and needs no etcd server; use "
                "--rdzv-backend c10d --rdzv-endpoint HOST:PORT",
                f, v));
          } else {
            detail::bad_value(f, v, "c10d or static");
          }
        },
        "PET_RDZV_BACKEND"}},
      {"rdzv-endpoint",
       {true,
        [&](std::string_view, std::string_view v) {
          if (v.empty()) {
            o.rdzv_endpoint.reset();  // torchrun's default "": none
            return;
          }
          o.rdzv_endpoint = std::string(v);
        },
        "PET_RDZV_ENDPOINT"}},
      {"rdzv-conf",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (detail::trim(v).empty()) return;
          const auto items = detail::split(v, ',');
          for (std::size_t k = 0; k < items.size(); ++k) {
            const std::string_view item = detail::trim(items[k]);
            const auto eq = item.find('=');
            if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
              throw UsageError(fmt::format(
                  "invalid value '{}' for --{}: piece {} ('{}') is not KEY=VALUE; expected "
                  "key1=value1,key2=value2,...",
                  v, f, k + 1, item));
            const std::string_view key = detail::trim(item.substr(0, eq));
            const std::string_view value = detail::trim(item.substr(eq + 1));
            if (key == "join_timeout" || key == "timeout") {
              o.join_timeout = seconds_conf(key, value);
            } else if (key == "last_call_timeout") {
              o.last_call_timeout = seconds_conf(key, value);
            } else if (key == "read_timeout" || key == "close_timeout") {
              seconds_conf(key, value);  // checked; no effect in gpurun (docs/cli.md)
            } else if (key == "is_host") {
              std::string low;
              for (char c : value)
                low += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
              if (low == "1" || low == "true" || low == "t" || low == "yes" || low == "y")
                o.is_host = true;
              else if (low == "0" || low == "false" || low == "f" || low == "no" || low == "n")
                o.is_host = false;
              else
                throw UsageError(fmt::format(
                    "invalid value '{}' for --{} is_host: expected true or false (1/0, yes/no)",
                    value, f));
            } else {
              o.warnings.push_back(fmt::format(
                  "--{} {}={}: gpurun's rendezvous has no such setting (it knows join_timeout, "
                  "last_call_timeout, read_timeout, close_timeout, is_host, timeout); ignored",
                  f, key, value));
            }
          }
        },
        "PET_RDZV_CONF"}},
      {"run-id", {true, run_id, "", "rdzv-id"}},
      {"rdzv-id", {true, run_id, "PET_RDZV_ID"}},
      {"join-timeout",
       {true, [&](std::string_view f,
                  std::string_view v) { o.join_timeout = detail::seconds_flag(f, v); }}},
      {"node-timeout",
       {true, [&](std::string_view f,
                  std::string_view v) { o.node_timeout = detail::seconds_flag(f, v); }}},
      {"store-memory-budget",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.store_memory_budget = detail::store_budget_flag(f, v);
        }}},
  });
}

/// Restarts, stopping and signals.
void add_lifecycle_flags(FlagTable& t, Options& o) {
  const Setter grace = [&](std::string_view f, std::string_view v) {  // SIGTERM -> SIGKILL
    o.grace_period = detail::seconds_flag(f, v);
    o.grace_period_given = true;
  };
  t.insert({
      {"max-restarts",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.max_restarts = detail::int_flag(f, v, 0, kMaxInt, "a non-negative integer");
        },
        "PET_MAX_RESTARTS"}},
      {"grace-period", {true, grace, "", "shutdown-timeout"}},
      {"shutdown-timeout", {true, grace, "PET_SHUTDOWN_TIMEOUT"}},  // later torch's name
      {"monitor-interval",  // gpurun is told of a worker's exit at once (SIGCHLD): no polling
       {true, [&](std::string_view f, std::string_view v) { detail::seconds_flag(f, v); },
        "PET_MONITOR_INTERVAL"}},
      {"start-method",  // gpurun always forks and execs the command (a fresh interpreter)
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v != "spawn" && v != "fork" && v != "forkserver")
            detail::bad_value(f, v, "spawn, fork or forkserver");
        },
        "PET_START_METHOD"}},
      {"role", {true, text_into(o.role, "a role name"), "PET_ROLE"}},
      {"signals-to-handle",
       {true,
        [&](std::string_view f, std::string_view v) {
          const auto items = detail::split(v, ',');
          for (std::size_t k = 0; k < items.size(); ++k) {
            const std::string_view name = detail::trim(items[k]);
            const auto sig = signal_from_name(name);
            if (name.empty() || !sig)
              throw UsageError(fmt::format(
                  "invalid value '{}' for --{}: piece {} ('{}') is not a signal name; expected "
                  "a list like SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                  v, f, k + 1, name));
            if (*sig == SIGKILL || *sig == SIGSTOP)
              throw UsageError(fmt::format(
                  "invalid value '{}' for --{}: {} cannot be handled by any process", v, f, name));
          }
          o.signals_to_handle = std::string(v);
        },
        "PET_SIGNALS_TO_HANDLE"}},
      {"preempt-signal",
       {true, [&](std::string_view f,
                  std::string_view v) { o.preempt_signal = preempt_signal_flag(f, v); }}},
      {"stop-timeout",
       {true, [&](std::string_view f,
                  std::string_view v) { o.stop_timeout = detail::seconds_flag(f, v); }}},
      {"requeue", {false, [&](std::string_view, std::string_view) { o.requeue = true; }}},
      {"exit-barrier-timeout",
       {true, [&](std::string_view f,
                  std::string_view v) { o.exit_barrier_timeout = detail::seconds_flag(f, v); }}},
  });
}

/// The workers' output: logs, redirects, filters and gpurun's event log.
void add_output_flags(FlagTable& t, Options& o) {
  t.insert({
      {"event-log-handler",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v != "null")
            throw UsageError(fmt::format(
                "--{} {}: torchrun's event handlers are Python plug-ins; gpurun writes its "
                "events as JSON lines with --event-log FILE (only 'null' is accepted here)",
                f, v));
        },
        "PET_EVENT_LOG_HANDLER"}},
      {"logs-specs",
       {true, refused("loads a torchrun Python plug-in (entry point group torchrun.logs_specs), "
                      "which gpurun cannot run; use --log-dir, --redirects, --tee and "
                      "--log-line-prefix-template")}},
      {"duplicate-stdout-filters",
       {true,
        refused("is not implemented by gpurun yet; use --tee 1 --log-dir DIR and grep the "
                "workers' stdout.log files"),
        "PET_DUPLICATE_STDOUT_FILTERS"}},
      {"duplicate-stderr-filters",
       {true,
        refused("is not implemented by gpurun yet; use --tee 2 --log-dir DIR and grep the "
                "workers' stderr.log files"),
        "PET_DUPLICATE_STDERR_FILTERS"}},
      {"log-dir", {true, text_into(o.log_dir, "a directory path"), "PET_LOG_DIR"}},
      {"redirects",
       {true, [&](std::string_view f, std::string_view v) { o.redirects = parse_std_spec(f, v); },
        "PET_REDIRECTS"}},
      {"tee",
       {true, [&](std::string_view f, std::string_view v) { o.tee = parse_std_spec(f, v); },
        "PET_TEE"}},
      {"ranks-filter",
       {true, [&](std::string_view f, std::string_view v) { o.ranks_filter = ranks_list(f, v); }}},
      {"local-ranks-filter",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v.empty()) {
            o.local_ranks_filter.reset();  // torchrun's default "": every local rank
            return;
          }
          o.local_ranks_filter = ranks_list(f, v);
        },
        "PET_LOCAL_RANKS_FILTER"}},
      {"log-line-prefix-template",
       {true, [&](std::string_view,
                  std::string_view v) { o.log_line_prefix_template = std::string(v); }}},
      {"event-log", {true, text_into(o.event_log, "a file path")}},
      // docs/metrics.md: the job's Prometheus endpoint and DCGM exporter's job files.
      {"metrics-port",
       {true,
        [&](std::string_view f, std::string_view v) {
          // [ADDRESS:]PORT; an IPv6 address in brackets ([::]:9401)
          const size_t colon = v.rfind(':');
          std::string_view port = colon == std::string_view::npos ? v : v.substr(colon + 1);
          std::string address =
              colon == std::string_view::npos ? "127.0.0.1" : std::string(v.substr(0, colon));
          if (address.size() >= 2 && address.front() == '[' && address.back() == ']')
            address = address.substr(1, address.size() - 2);
          if (address.empty())
            throw UsageError(
                fmt::format("invalid value '{}' for --{}: expected [ADDRESS:]PORT, e.g. 9401 or "
                            "0.0.0.0:9401",
                            v, f));
          o.metrics_port = static_cast<uint16_t>(
              detail::int_flag(f, port, 0, 65535, "[ADDRESS:]PORT with a port number 0-65535"));
          o.metrics_address = address;
        }}},
      {"dcgm-job-dir", {true, text_into(o.dcgm_job_dir, "a directory path")}},
  });
}

/// How the worker command runs (Python or not, device, energy, config), and help/version.
void add_program_flags(FlagTable& t, Options& o) {
  t.insert({
      {"virtual-local-rank",
       {false, [&](std::string_view, std::string_view) { o.virtual_local_rank = true; },
        "PET_VIRTUAL_LOCAL_RANK"}},
      {"numa-binding",
       {true, refused("is not implemented by gpurun; bind in the worker command instead (e.g. "
                      "numactl --cpunodebind=0 --membind=0 ./train) or with Slurm's --cpu-bind")}},
      {"config", {true, text_into(o.config, "a file path")}},
      {"energy",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v == "auto")
            o.energy = EnergyMode::kAuto;
          else if (v == "on")
            o.energy = EnergyMode::kOn;
          else if (v == "off")
            o.energy = EnergyMode::kOff;
          else
            detail::bad_value(f, v, "auto, on or off");
        }}},
      {"energy-summary", {true, text_into(o.energy_summary, "a file path")}},
      {"device",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v == "cuda")
            o.device = Device::kCuda;
          else if (v == "cpu")
            o.device = Device::kCpu;
          else
            detail::bad_value(f, v, "cuda or cpu");
          o.device_given = true;
        }}},
      {"simulate-gpus", {true, text_into(o.simulate_gpus, "a GPU count or a state file")}},
      {"module",
       {false, [&](std::string_view, std::string_view) { o.module = true; }, "PET_MODULE"}},
      {"no-python",
       {false, [&](std::string_view, std::string_view) { o.no_python = true; }, "PET_NO_PYTHON"}},
      {"run-path",
       {false, [&](std::string_view, std::string_view) { o.run_path = true; }, "PET_RUN_PATH"}},
      // torch.distributed.launch's: the local rank only in LOCAL_RANK, not as --local-rank=N.
      {"use-env", {false, [&](std::string_view, std::string_view) { o.use_env = true; }, ""}},
      {"help", {false, [&](std::string_view, std::string_view) { o.help = true; }}},
      {"version", {false, [&](std::string_view, std::string_view) { o.version = true; }}},
  });
}

}  // namespace

FlagTable flag_table(Options& o) {
  FlagTable t;
  add_node_flags(t, o);
  add_rendezvous_flags(t, o);
  add_lifecycle_flags(t, o);
  add_output_flags(t, o);
  add_program_flags(t, o);
  return t;
}

}  // namespace gpurun::supervisor::cli
