#include "supervisor/cli.hpp"

#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "gpurun/error.hpp"

#ifndef GPURUN_VERSION
#define GPURUN_VERSION "0.1.0"
#endif

namespace gpurun::supervisor {
namespace detail {

/// Parses a whole decimal integer in [lo, hi]; nullopt on anything else.
std::optional<long long> to_int(std::string_view s, long long lo, long long hi) {
  long long v = 0;
  if (s.empty()) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

[[noreturn]] void bad_value(std::string_view flag, std::string_view value, std::string_view want) {
  throw UsageError(fmt::format("invalid value '{}' for --{}: expected {}", value, flag, want));
}

int int_flag(std::string_view flag, std::string_view value, long long lo, long long hi,
             std::string_view want) {
  auto v = to_int(value, lo, hi);
  if (!v) {
    // A well-formed integer above the range (even one no integer type holds) says so,
    // unless `want` already names the bound ("a port number 0-65535").
    const bool digits = value.find_first_not_of("0123456789") == value.npos;
    long long big = 0;
    const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), big);
    if (digits && p == value.data() + value.size() &&
        (ec == std::errc::result_out_of_range || (ec == std::errc{} && big > hi)) &&
        want.find(std::to_string(hi)) == std::string_view::npos)
      throw UsageError(
          fmt::format("invalid value '{}' for --{}: too large (at most {})", value, flag, hi));
    bad_value(flag, value, want);
  }
  return static_cast<int>(*v);
}

std::optional<std::string> run_id_problem(std::string_view id) {
  if (id.empty()) return "a run id cannot be empty";
  if (id.find_first_not_of('.') == std::string_view::npos)
    return "a run id cannot be only dots ('.', '..')";
  for (unsigned char c : id) {
    if (c == '/') return "a run id names a directory under --log-dir and cannot contain '/'";
    if (c < 0x20 || c == 0x7f) return "a run id cannot contain NUL or other control characters";
  }
  return std::nullopt;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? s.npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// Canonical flag name: without leading dashes, '_' replaced by '-'.
std::string canonical(std::string_view name) {
  std::string out(name);
  for (char& c : out)
    if (c == '_') c = '-';
  return out;
}

}  // namespace detail

StdSpec parse_std_spec(std::string_view flag, std::string_view value) {
  constexpr std::string_view kWant = "0-3 or a per-local-rank map like 0:1,1:2";
  StdSpec spec;
  if (value.find(':') == std::string_view::npos) {
    spec.all = detail::int_flag(flag, value, 0, 3, kWant);
    return spec;
  }
  for (auto item : detail::split(value, ',')) {
    auto parts = detail::split(detail::trim(item), ':');
    if (parts.size() != 2) detail::bad_value(flag, value, kWant);
    auto rank = detail::to_int(detail::trim(parts[0]), 0, std::numeric_limits<int>::max());
    auto bits = detail::to_int(detail::trim(parts[1]), 0, 3);
    if (!rank || !bits) detail::bad_value(flag, value, kWant);
    spec.per_rank[static_cast<int>(*rank)] = static_cast<int>(*bits);
  }
  return spec;
}

Options parse(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse(args);
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  using Setter = std::function<void(std::string_view flag, std::string_view value)>;
  struct Flag {
    bool takes_value;
    Setter set;
  };
  constexpr auto kMaxInt = std::numeric_limits<int>::max();
  const Setter nproc = [&](std::string_view f, std::string_view v) {
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
  const std::map<std::string, Flag, std::less<>> flags = {
      {"nproc", {true, nproc}},
      {"nproc-per-node", {true, nproc}},
      {"nnodes",
       {true,
        [&](std::string_view f, std::string_view v) {
          // torchrun also takes MIN:MAX; only a static MIN==MAX is supported.
          auto parts = detail::split(v, ':');
          if (parts.size() > 2) detail::bad_value(f, v, "a positive integer (static N or N:N)");
          int n = detail::int_flag(f, parts[0], 1, kMaxInt, "a positive integer (static N or N:N)");
          if (parts.size() == 2 && detail::int_flag(f, parts[1], 1, kMaxInt,
                                                    "a positive integer (static N or N:N)") != n)
            throw UsageError(fmt::format(
                "invalid value '{}' for --nnodes: elastic node ranges are not supported, "
                "give a static node count",
                v));
          o.nnodes = n;
        }}},
      {"node-rank",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.node_rank = detail::int_flag(f, v, 0, kMaxInt, "a non-negative integer");
        }}},
      {"master-addr",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v.empty()) detail::bad_value(f, v, "a host name or address");
          o.master_addr = std::string(v);
        }}},
      {"master-port",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.master_port =
              static_cast<uint16_t>(detail::int_flag(f, v, 0, 65535, "a port number 0-65535"));
          o.master_port_given = true;
        }}},
      {"standalone", {false, [&](std::string_view, std::string_view) { o.standalone = true; }}},
      {"max-restarts",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.max_restarts = detail::int_flag(f, v, 0, kMaxInt, "a non-negative integer");
        }}},
      {"grace-period",
       {true,
        [&](std::string_view f, std::string_view v) {
          // Seconds, integer or decimal ("2", "0.5").
          double secs = -1;
          std::string s(v);
          size_t used = 0;
          try {
            secs = std::stod(s, &used);
          } catch (const std::exception&) {
            used = 0;
          }
          if (s.empty() || used != s.size() || !(secs >= 0) || secs > 86400.0)
            detail::bad_value(f, v, "a number of seconds between 0 and 86400");
          o.grace_period = std::chrono::milliseconds(std::llround(secs * 1000.0));
        }}},
      {"log-dir",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v.empty()) detail::bad_value(f, v, "a directory path");
          o.log_dir = std::string(v);
        }}},
      {"redirects",
       {true, [&](std::string_view f, std::string_view v) { o.redirects = parse_std_spec(f, v); }}},
      {"tee",
       {true, [&](std::string_view f, std::string_view v) { o.tee = parse_std_spec(f, v); }}},
      {"ranks-filter",
       {true,
        [&](std::string_view f, std::string_view v) {
          std::set<int> ranks;
          for (auto item : detail::split(v, ','))
            ranks.insert(detail::int_flag(f, detail::trim(item), 0, kMaxInt,
                                          "a comma-separated list of ranks like 0,3"));
          o.ranks_filter = std::move(ranks);
        }}},
      {"log-line-prefix-template",
       {true, [&](std::string_view,
                  std::string_view v) { o.log_line_prefix_template = std::string(v); }}},
      {"run-id", {true, run_id}},
      {"rdzv-id", {true, run_id}},
      {"config",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v.empty()) detail::bad_value(f, v, "a file path");
          o.config = std::string(v);
        }}},
      {"event-log",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v.empty()) detail::bad_value(f, v, "a file path");
          o.event_log = std::string(v);
        }}},
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
      {"energy-summary",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v.empty()) detail::bad_value(f, v, "a file path");
          o.energy_summary = std::string(v);
        }}},
      {"device",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v == "cuda")
            o.device = Device::kCuda;
          else if (v == "cpu")
            o.device = Device::kCpu;
          else
            detail::bad_value(f, v, "cuda or cpu");
        }}},
      {"module", {false, [&](std::string_view, std::string_view) { o.module = true; }}},
      {"no-python", {false, [&](std::string_view, std::string_view) { o.no_python = true; }}},
      {"help", {false, [&](std::string_view, std::string_view) { o.help = true; }}},
      {"version", {false, [&](std::string_view, std::string_view) { o.version = true; }}},
  };

  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // first non-flag: the worker command
    std::string_view body;
    if (arg == "-m") {
      body = "module";
    } else if (arg == "-h") {
      body = "help";
    } else if (arg.substr(0, 2) == "--" && arg.size() > 2) {
      body = arg.substr(2);
    } else {
      throw UsageError(fmt::format("unknown flag '{}' (see gpurun --help)", arg));
    }
    std::optional<std::string_view> inline_value;
    if (auto eq = body.find('='); eq != std::string_view::npos) {
      inline_value = body.substr(eq + 1);
      body = body.substr(0, eq);
    }
    const std::string name = detail::canonical(body);
    auto it = flags.find(name);
    if (it == flags.end())
      throw UsageError(fmt::format("unknown flag '--{}' (see gpurun --help)", body));
    const Flag& flag = it->second;
    if (!flag.takes_value) {
      if (inline_value)
        throw UsageError(fmt::format("flag --{} takes no value, got '{}'", name, *inline_value));
      flag.set(name, {});
      continue;
    }
    std::string_view value;
    if (inline_value) {
      value = *inline_value;
    } else {
      if (i + 1 >= args.size()) throw UsageError(fmt::format("flag --{} needs a value", name));
      value = args[++i];
    }
    flag.set(name, value);
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());

  if (o.help || o.version) return o;
  if (o.command.empty())
    throw UsageError("missing worker command, e.g. gpurun --nproc 2 ./train (see gpurun --help)");
  if (o.node_rank >= o.nnodes)
    throw UsageError(fmt::format("invalid value '{}' for --node-rank: must be below --nnodes {}",
                                 o.node_rank, o.nnodes));
  if (o.standalone && o.nnodes > 1)
    throw UsageError(fmt::format("--standalone runs a single node, but --nnodes is {}", o.nnodes));
  if (o.standalone && o.master_port_given && o.master_port != 0)
    throw UsageError(fmt::format(
        "--standalone picks a free port itself and cannot be combined with --master-port {}; "
        "drop one of them",
        o.master_port));
  if (o.nnodes > 1 && o.node_rank > 0 && o.master_port == 0)
    throw UsageError(
        "--master-port 0 cannot be used on a node with --node-rank > 0: give the port that node 0 "
        "listens on");
  if (o.module && o.no_python) throw UsageError("--module and --no-python cannot be combined");
  return o;
}

std::string version_text() {
  return fmt::format("gpurun {}", GPURUN_VERSION);
}

std::string help_text() {
  return R"(usage: gpurun [options] [--] command [args...]

Launches one worker process per slot, hosts the TCPStore they rendezvous on,
and supervises them (torchrun-compatible environment, flags and exit codes).

Topology:
  --nproc, --nproc-per-node N|auto|gpu|cpu   workers on this node (default 1)
  --nnodes N              static number of nodes (default 1)
  --node-rank R           index of this node (default 0); node 0 hosts the store
  --master-addr ADDR      store address given to workers (default 127.0.0.1)
  --master-port PORT      store port (default 29500); 0 = pick a free port
  --standalone            single node: MASTER_ADDR=localhost, free port, random run id
  --device cuda|cpu       slots are GPUs (default cuda) or CPU-only virtual slots

Supervision:
  --max-restarts K        restart the whole worker set at most K times (default 0)
  --grace-period SECONDS  SIGTERM -> SIGKILL delay on teardown (default 30)

Logs:
  --log-dir DIR           keep DIR/<run_id>_XXXXXX/attempt_<n>/<rank>/{stdout,stderr}.log
                          (a new unique directory per run, printed at start)
  --redirects SPEC        streams sent only to log files: 0 none, 1 stdout, 2 stderr,
                          3 both, or per local rank like 0:1,1:2
  --tee SPEC              streams sent to log files and the console (same syntax)
  --ranks-filter LIST     console shows only these ranks, e.g. 0,3
  --log-line-prefix-template T  console prefix (default "[rank${rank}]: "),
                          with ${rank}, ${local_rank}, ${role_name}
  --event-log FILE        append JSON-lines events (start, worker_started, ...)

Energy (docs/energy.md):
  --energy auto|on|off    GPU energy monitor through NVML (default auto: on with
                          --device cuda when NVML loads; on: also --device cpu, slot i
                          standing for visible GPU i, e.g. with a fake NVML)
  --energy-summary FILE   write the run's energy/time/cost summary (JSON) at exit

Identity:
  --run-id, --rdzv-id ID  TORCHELASTIC_RUN_ID (default none)
  --config FILE           elastic mode: config.toml decides the active GPUs at
                          epoch boundaries (docs/control-protocol.md)

Status of a running job (another terminal):
  gpurun status [--json] [--run-id ID | --run-dir DIR]

Worker command:
  -m, --module            run `python3 -u -m command args...`
  --no-python             run the command as given even if it ends in .py
  A command ending in .py is run as `python3 -u command args...`.

  -h, --help              this text
  --version               print the version

Examples:
  gpurun --nproc 8 ./train --epochs 3
  gpurun --nproc 4 --device cpu python3 train.py
  gpurun --standalone --nproc-per-node=gpu train.py
  gpurun --nproc 2 --max-restarts 3 --log-dir /tmp/logs --tee 3 -- ./train
  CUDA_VISIBLE_DEVICES=2,3 gpurun --nproc 2 ./train     # slots 0,1 on GPUs 2,3

Exit status: 0 when every worker succeeds; the first failing worker's exit code,
or 128+signal when it was killed by a signal; 1 for a launcher error; 2 for a
usage error; 127 when the command cannot be found. See docs/cli.md.
)";
}

}  // namespace gpurun::supervisor
