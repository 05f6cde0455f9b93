#include "cli/cli.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "cli/cli_flags.hpp"
#include "gpurun/error.hpp"
#include "supervisor/preemption.hpp"

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

/// "4GiB", "512MiB", "64M", "1048576" (bytes; K/M/G and KiB/MiB/GiB are powers of 1024;
/// "0" = unlimited) -> bytes. Throws UsageError naming the flag for anything else or a size in
/// 1 .. 16 MiB - 1 (the store must fit one 8 MiB value while it is received and stored).
std::size_t store_budget_flag(std::string_view flag, std::string_view value) {
  constexpr std::string_view want =
      "a size in bytes with an optional K, M, G, KiB, MiB or GiB suffix (0 = unlimited)";
  size_t digits = 0;
  while (digits < value.size() && value[digits] >= '0' && value[digits] <= '9') ++digits;
  const auto n = to_int(value.substr(0, digits), 0, (1LL << 50));
  if (!n) bad_value(flag, value, want);
  const std::string_view unit = value.substr(digits);
  int shift = -1;
  if (unit.empty()) shift = 0;
  if (unit == "K" || unit == "KiB") shift = 10;
  if (unit == "M" || unit == "MiB") shift = 20;
  if (unit == "G" || unit == "GiB") shift = 30;
  if (shift < 0) bad_value(flag, value, want);
  const auto bytes = static_cast<unsigned long long>(*n) << shift;
  if (bytes != 0 && bytes < (16ULL << 20))
    throw UsageError(fmt::format(
        "invalid value '{}' for --{}: {} bytes is under the 16 MiB minimum (one 8 MiB value "
        "must fit while it is received and stored); 0 means unlimited",
        value, flag, bytes));
  return static_cast<std::size_t>(bytes);
}

/// Seconds, integer or decimal ("2", "0.5"), 0..86400 -> milliseconds (rounded). Throws
/// UsageError naming the flag otherwise.
std::chrono::milliseconds seconds_flag(std::string_view flag, std::string_view value) {
  double secs = -1;
  const std::string s(value);
  size_t used = 0;
  try {
    secs = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || !(secs >= 0) || secs > 86400.0)
    bad_value(flag, value, "a number of seconds between 0 and 86400");
  return std::chrono::milliseconds(std::llround(secs * 1000.0));
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

Endpoint parse_endpoint(std::string_view flag, std::string_view value, uint16_t default_port) {
  constexpr std::string_view kWant = "HOST[:PORT], with an IPv6 address in brackets: [::1]:29400";
  Endpoint e;
  e.port = default_port;
  std::string_view rest;
  if (!value.empty() && value.front() == '[') {
    const auto close = value.find(']');
    if (close == std::string_view::npos || close == 1) bad_value(flag, value, kWant);
    e.host = std::string(value.substr(1, close - 1));
    rest = value.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') bad_value(flag, value, kWant);
  } else if (std::count(value.begin(), value.end(), ':') > 1) {
    e.host = std::string(value);  // a bare IPv6 address: no port can follow it
    in6_addr a6{};
    if (::inet_pton(AF_INET6, e.host.substr(0, e.host.find('%')).c_str(), &a6) != 1)
      bad_value(flag, value, kWant);
  } else {
    const auto colon = value.find(':');
    e.host = std::string(value.substr(0, colon));
    if (colon != std::string_view::npos) rest = value.substr(colon);
  }
  if (e.host.empty()) bad_value(flag, value, kWant);
  if (!rest.empty()) {
    const auto port = to_int(rest.substr(1), 0, 65535);
    if (!port) bad_value(flag, value, kWant);
    e.port = static_cast<uint16_t>(*port);
    e.port_given = true;
  }
  return e;
}

}  // namespace detail

namespace {
/// --rdzv-endpoint names the store: it becomes the master address and port (torchrun: the
/// master flags matter only for a static rendezvous without an endpoint).
void apply_rdzv_endpoint(Options& o) {
  const uint16_t fallback = o.rdzv_backend == RdzvBackend::kC10d ? 29400 : o.master_port;
  const detail::Endpoint e = detail::parse_endpoint("rdzv-endpoint", *o.rdzv_endpoint, fallback);
  if (o.master_addr_given && o.master_addr != e.host)
    o.warnings.push_back(
        fmt::format("--master-addr {} is not used: --rdzv-endpoint {} names the "
                    "store",
                    o.master_addr, *o.rdzv_endpoint));
  if (o.master_port_given && o.master_port != e.port)
    o.warnings.push_back(
        fmt::format("--master-port {} is not used: --rdzv-endpoint {} names the "
                    "store",
                    o.master_port, *o.rdzv_endpoint));
  o.master_addr = e.host;
  o.master_port = e.port;
  o.master_addr_given = o.master_port_given = true;
}
}  // namespace

StdSpec parse_std_spec(std::string_view flag, std::string_view value) {
  constexpr std::string_view kWant = "0-3 or a per-local-rank map like 0:1,1:2";
  StdSpec spec;
  spec.text = std::string(value);
  if (value.find(':') == std::string_view::npos) {
    spec.all = detail::int_flag(flag, value, 0, 3, kWant);
    return spec;
  }
  std::map<int, std::size_t> piece_of;  // local rank -> the piece (from 1) that gave it
  const auto items = detail::split(value, ',');
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (detail::trim(items[i]).empty())
      throw UsageError(
          fmt::format("invalid value '{}' for --{}: piece {} is empty", value, flag, i + 1));
    auto parts = detail::split(detail::trim(items[i]), ':');
    if (parts.size() != 2) detail::bad_value(flag, value, kWant);
    auto rank = detail::to_int(detail::trim(parts[0]), 0, std::numeric_limits<int>::max());
    auto bits = detail::to_int(detail::trim(parts[1]), 0, 3);
    if (!rank || !bits) detail::bad_value(flag, value, kWant);
    const int r = static_cast<int>(*rank);
    if (const auto seen = piece_of.find(r); seen != piece_of.end())
      throw UsageError(fmt::format(
          "invalid value '{}' for --{}: local rank {} is given twice (pieces {} and {})", value,
          flag, r, seen->second, i + 1));
    piece_of.emplace(r, i + 1);
    spec.per_rank[r] = static_cast<int>(*bits);
  }
  return spec;
}

void check_local_ranks(const Options& o, int local_ranks, std::string_view counted_by) {
  const std::string whose =
      counted_by.empty() ? fmt::format("--nproc {}", local_ranks) : std::string(counted_by);
  const auto check = [&](std::string_view flag, const StdSpec& spec) {
    if (spec.per_rank.empty() || spec.per_rank.rbegin()->first < local_ranks) return;
    const auto items = detail::split(spec.text, ',');
    for (std::size_t i = 0; i < items.size(); ++i) {
      const auto parts = detail::split(detail::trim(items[i]), ':');
      const auto rank = detail::to_int(detail::trim(parts[0]), 0, std::numeric_limits<int>::max());
      if (!rank || *rank < local_ranks) continue;
      throw UsageError(fmt::format(
          "invalid value '{}' for --{}: piece {} ('{}') names local rank {}, but {} has {}",
          spec.text, flag, i + 1, detail::trim(items[i]), *rank, whose,
          local_ranks == 1 ? std::string("only local rank 0")
                           : fmt::format("local ranks 0-{}", local_ranks - 1)));
    }
  };
  check("redirects", o.redirects);
  check("tee", o.tee);
}

Options parse(int argc, const char* const* argv, const std::map<std::string, std::string>& env) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse(args, env);
}

namespace {
// The command line's flags, in order; applied after torchrun's PET_* variables
// (docs/cli.md#torchrun-flags), which are read only for the flags the command line does not
// give (as argparse, which takes them as defaults and never parses one the line overrides).
struct Given {
  std::string name;
  const cli::Flag* flag;
  std::string value;
};
struct CommandLine {
  std::vector<Given> given;
  std::set<std::string> on_line;  // the torchrun names of the flags given
  size_t command = 0;             // where the worker command starts in args
};

/// Reads the flags up to the worker command (the first non-flag word, or the word after "--"):
/// each must name a flag of `flags` and have its value if it takes one. Sets nothing.
CommandLine read_command_line(const std::vector<std::string>& args, const cli::FlagTable& flags) {
  CommandLine line;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // first non-flag: the worker command
    std::string_view body;
    std::string attached;  // "-r3", "-t=3": a short flag's value in the same word
    if (arg == "-m") {
      body = "module";
    } else if (arg == "-h") {
      body = "help";
    } else if (arg[1] == 'r' || arg[1] == 't') {
      body = arg[1] == 'r' ? "redirects" : "tee";
      if (arg.size() > 2) {
        attached = std::string(body) + "=" + std::string(arg.substr(arg[2] == '=' ? 3 : 2));
        body = attached;
      }
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
    const cli::Flag& flag = it->second;
    line.on_line.insert(flag.same_as.empty() ? name : flag.same_as);
    if (!flag.takes_value) {
      if (inline_value)
        throw UsageError(fmt::format("flag --{} takes no value, got '{}'", name, *inline_value));
      line.given.push_back({name, &flag, {}});
      continue;
    }
    std::string_view value;
    if (inline_value) {
      value = *inline_value;
    } else {
      if (i + 1 >= args.size()) throw UsageError(fmt::format("flag --{} needs a value", name));
      value = args[++i];
    }
    line.given.push_back({name, &flag, std::string(value)});
  }
  line.command = i;
  return line;
}

/// Applies torchrun's PET_* variables in `env` for the flags the command line does not give.
void apply_pet_variables(const cli::FlagTable& flags, const std::set<std::string>& on_line,
                         const std::map<std::string, std::string>& env) {
  for (const auto& [name, flag] : flags) {
    if (flag.pet.empty() || on_line.count(name)) continue;
    auto it = env.find(flag.pet);
    // Kubeflow's PyTorchJob (training-operator v1) names torchrun's PET_NPROC_PER_NODE
    // PET_N_PROC_PER_NODE (its elasticPolicy.nProcPerNode): read as the same.
    if (it == env.end() && flag.pet == "PET_NPROC_PER_NODE") it = env.find("PET_N_PROC_PER_NODE");
    if (it == env.end()) continue;
    const std::string from = fmt::format("{} (from {})", name, it->first);
    if (flag.takes_value) {
      flag.set(from, it->second);
      continue;
    }
    const auto on = detail::to_int(detail::trim(it->second), std::numeric_limits<int>::min(),
                                   std::numeric_limits<int>::max());
    if (!on)
      throw UsageError(
          fmt::format("invalid value '{}' for {}: expected an integer (1 = --{}, "
                      "0 = off), as torchrun reads it",
                      it->second, flag.pet, name));
    if (*on != 0) flag.set(from, {});
  }
}

/// Where the store listens: --standalone drops the rendezvous flags, --rdzv-endpoint names the
/// store, and else MASTER_PORT in gpurun's environment may name its port.
void settle_store_address(Options& o, const std::map<std::string, std::string>& env) {
  if (o.standalone && (o.rdzv_endpoint || o.rdzv_backend != RdzvBackend::kStatic)) {
    // torchrun: with --standalone the rendezvous flags are auto-assigned, given ones ignored
    o.warnings.push_back(
        "--standalone picks its own local rendezvous: --rdzv-backend and --rdzv-endpoint are "
        "not used");
    o.rdzv_endpoint.reset();
    o.rdzv_backend = RdzvBackend::kStatic;
  }
  if (o.rdzv_endpoint) apply_rdzv_endpoint(o);
  // MASTER_PORT in gpurun's environment (a Slurm script's `export MASTER_PORT=…`) names the
  // store's port when no flag, PET_MASTER_PORT or endpoint did; torchrun reads only those two
  // (docs/cli.md#ports). --standalone picks its own.
  if (const auto it = env.find("MASTER_PORT");
      it != env.end() && !o.master_port_given && !o.standalone) {
    const std::string_view v = detail::trim(it->second);
    if (!v.empty()) {
      const auto port = detail::to_int(v, 0, 65535);
      if (!port)
        throw UsageError(fmt::format(
            "invalid value '{}' for MASTER_PORT in gpurun's environment: expected a port number "
            "0-65535",
            v));
      o.master_port = static_cast<uint16_t>(*port);
      o.master_port_given = true;
    }
  }
}

/// The checks that span several flags, once every flag is applied.
void check_combinations(const Options& o) {
  // An elastic job (--config) takes nodes at any time, whatever its rendezvous: its range only
  // bounds how many (docs/cli.md#elastic-nodes).
  if (o.nnodes != o.nnodes_max && o.rdzv_backend != RdzvBackend::kC10d && !o.config)
    throw UsageError(fmt::format(
        "--nnodes {}:{}: a node range needs --rdzv-backend c10d (a static rendezvous has a "
        "fixed node count) or --config (an elastic job)",
        o.nnodes, o.nnodes_max));
  if (o.command.empty())
    throw UsageError("missing worker command, e.g. gpurun --nproc 2 ./train (see gpurun --help)");
  // With --slurm and no --nnodes the node count comes from Slurm: apply_slurm checks the rank.
  if (o.node_rank >= o.nnodes_max && !(o.slurm == SlurmMode::kOn && !o.nnodes_given))
    throw UsageError(fmt::format("invalid value '{}' for --node-rank: must be below --nnodes {}",
                                 o.node_rank, o.nnodes_max));
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
  // The local ranks are known here for a plain --nproc N (elastic mode on GPUs makes every
  // visible GPU a slot: main checks once it knows them, as for --nproc gpu|cpu|auto).
  // With --slurm and no --nproc the count comes from Slurm's GPUs: main checks then.
  if (o.nproc_mode == NprocMode::kCount && !(o.config && o.device == Device::kCuda) &&
      (o.nproc_given || o.slurm != SlurmMode::kOn))
    check_local_ranks(o, o.nproc);
}
}  // namespace

namespace {
/// --simulate-gpus: the workers on the CPU (simulated GPUs have no CUDA), energy monitoring on.
void settle_simulated_gpus(Options& o) {
  if (!o.simulate_gpus) return;
  if (o.simulate_gpus->empty())
    throw UsageError("invalid value '' for --simulate-gpus: give a GPU count or a state file");
  if (o.device_given && o.device == Device::kCuda)
    throw UsageError(
        "--simulate-gpus simulates NVML, not CUDA: its workers run on the CPU; drop --device "
        "cuda");
  if (o.energy == EnergyMode::kOff)
    throw UsageError("--simulate-gpus is for the energy features; drop --energy off");
  o.device = Device::kCpu;
  o.energy = EnergyMode::kOn;
}

/// "python", "python3", "python3.11", or a path ending in one of them.
bool names_python(std::string_view word) {
  if (const auto slash = word.rfind('/'); slash != std::string_view::npos)
    word = word.substr(slash + 1);
  if (word.substr(0, 6) != "python") return false;
  return std::all_of(word.begin() + 6, word.end(),
                     [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
}

/// Whether `args[at]` is a flag of `flags` that takes its value in the next word ("--nproc",
/// "-r"; not "--nproc=2", "-r3" or a switch). Unknown words are not.
bool value_in_next_word(const std::vector<std::string>& args, size_t at,
                        const cli::FlagTable& flags) {
  const std::string_view arg = args[at];
  if (arg == "-r" || arg == "-t") return true;
  if (arg.substr(0, 2) != "--" || arg.find('=') != std::string_view::npos) return false;
  const auto it = flags.find(detail::canonical(arg.substr(2)));
  return it != flags.end() && it->second.takes_value;
}

/// Finds the words `python -m torch.distributed.launch` (or `.run`) put before the launcher's
/// own flags, as typed after `gpurun` in place of `python`: `-m torch.distributed.launch`, or
/// the whole `python3 -m torch.distributed.launch`, first or after some of gpurun's flags
/// (`gpurun --device cpu -m torch.distributed.launch …`). Sets `o.launch_shape` (launch, not
/// run: run is torchrun) and `o.python`, and returns `args` without those words. Running
/// torch's own launcher as every worker's program is never what a line means, so these words
/// are never taken as the worker command.
std::vector<std::string> drop_launcher_words(std::vector<std::string> args,
                                             const cli::FlagTable& flags, Options& o) {
  const auto is_launcher = [](const std::string& m) {
    return m == "torch.distributed.launch" || m == "torch.distributed.run";
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const bool python = names_python(args[i]);
    const size_t m = python ? i + 1 : i;
    if (m + 1 < args.size() && (args[m] == "-m" || args[m] == "--module") &&
        is_launcher(args[m + 1])) {
      o.launch_shape = args[m + 1] == "torch.distributed.launch";
      if (python) o.python = args[i];
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
                 args.begin() + static_cast<std::ptrdiff_t>(m + 2));
      return args;
    }
    // Past gpurun's flags (the worker command, or "--" before it): no launcher words.
    if (args[i] == "--" || args[i].size() < 2 || args[i][0] != '-') return args;
    if (value_in_next_word(args, i, flags)) ++i;
  }
  return args;
}
}  // namespace

Options parse(const std::vector<std::string>& args_in,
              const std::map<std::string, std::string>& env) {
  Options o;
  const cli::FlagTable flags = cli::flag_table(o);
  const std::vector<std::string> args = drop_launcher_words(args_in, flags, o);
  const CommandLine line = read_command_line(args, flags);
  apply_pet_variables(flags, line.on_line, env);
  for (const Given& g : line.given) g.flag->set(g.name, g.value);
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(line.command), args.end());

  if (o.help || o.version) return o;
  settle_simulated_gpus(o);
  settle_store_address(o, env);
  if (o.run_path) o.no_python = false;  // torchrun: --run-path takes precedence
  check_combinations(o);
  return o;
}

}  // namespace gpurun::supervisor
