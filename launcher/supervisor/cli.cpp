#include "supervisor/cli.hpp"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "gpurun/error.hpp"
#include "supervisor/preemption.hpp"

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

}  // namespace detail

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

namespace {
/// The numeric addresses of `list`, in order, without duplicates (IPv6 with "%scope" when set).
std::vector<std::string> numeric_addresses(const addrinfo* list) {
  std::vector<std::string> out;
  for (const addrinfo* a = list; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    std::string addr;
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) addr = text;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      if (::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text)) addr = text;
      char name[IF_NAMESIZE] = {};
      if (!addr.empty() && in6->sin6_scope_id != 0 && ::if_indextoname(in6->sin6_scope_id, name))
        addr += std::string("%") + name;
    }
    if (!addr.empty() && std::find(out.begin(), out.end(), addr) == out.end()) out.push_back(addr);
  }
  return out;
}

/// getaddrinfo's answer for the name `host` within `timeout`: 0 (with `addresses` filled), an
/// EAI_* code, or EAI_AGAIN with `timed_out` set. getaddrinfo_a runs the lookup on glibc's own
/// thread; a lookup that does not answer in time is cancelled (or, when glibc cannot cancel it,
/// left to finish on its own: its request block is then deliberately not freed).
int lookup(const std::string& host, std::chrono::milliseconds timeout, bool& timed_out,
           std::vector<std::string>& addresses) {
  struct Request {
    std::string host;
    addrinfo hints{};
    gaicb cb{};
  };
  auto* req = new Request;
  req->host = host;
  req->hints.ai_family = AF_UNSPEC;
  req->hints.ai_socktype = SOCK_STREAM;
  req->hints.ai_flags = 0;  // no AI_ADDRCONFIG: a loopback-only host still resolves ::1
  req->cb.ar_name = req->host.c_str();
  req->cb.ar_request = &req->hints;
  gaicb* list[] = {&req->cb};
  if (const int rc = ::getaddrinfo_a(GAI_NOWAIT, list, 1, nullptr); rc != 0) {
    delete req;
    return rc;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::gai_error(&req->cb) == EAI_INPROGRESS) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    const timespec wait{static_cast<time_t>(ns / 1'000'000'000),
                        static_cast<long>(ns % 1'000'000'000)};
    const gaicb* const waiting[] = {&req->cb};
    ::gai_suspend(waiting, 1, &wait);  // EAI_AGAIN (timeout), EAI_INTR or done: re-check
  }
  if (::gai_error(&req->cb) == EAI_INPROGRESS) {
    const int cancel = ::gai_cancel(&req->cb);
    if (cancel != EAI_ALLDONE) {  // it answered just now: use the answer
      timed_out = true;
      if (cancel == EAI_CANCELED) delete req;  // else glibc still holds it
      return EAI_AGAIN;
    }
  }
  const int rc = ::gai_error(&req->cb);
  if (rc == 0) addresses = numeric_addresses(req->cb.ar_result);
  if (req->cb.ar_result) ::freeaddrinfo(req->cb.ar_result);
  delete req;
  return rc;
}

/// True when `host` is in the .invalid domain, which never resolves (RFC 6761 6.4: resolvers
/// answer it at once, without asking DNS).
bool invalid_domain(std::string_view host) {
  while (!host.empty() && host.back() == '.') host.remove_suffix(1);
  constexpr std::string_view kInvalid = "invalid";
  if (host.size() < kInvalid.size()) return false;
  const std::string_view tail = host.substr(host.size() - kInvalid.size());
  for (std::size_t i = 0; i < tail.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(tail[i])) != kInvalid[i]) return false;
  return host.size() == kInvalid.size() || host[host.size() - kInvalid.size() - 1] == '.';
}
}  // namespace

AddressCheck check_master_addr(const std::string& addr, std::chrono::milliseconds timeout) {
  AddressCheck out;
  std::string host = addr;
  const bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
  if (bracketed) host = host.substr(1, host.size() - 2);
  // A literal needs no lookup: numeric first (no DNS, no /etc/hosts, never blocks).
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* numeric = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &numeric) == 0) {
    ::freeaddrinfo(numeric);
    if (!bracketed || host.find(':') != std::string::npos) {
      out.addresses = {host};
      return out;
    }
  }
  if (bracketed || host.find_first_of("[]") != std::string::npos) {
    out.result = AddressCheck::Result::kUnresolvable;
    out.reason = "brackets enclose only an IPv6 address, e.g. [::1]";
    return out;
  }
  if (invalid_domain(host)) {
    out.result = AddressCheck::Result::kUnresolvable;
    out.reason = ::gai_strerror(EAI_NONAME);
    return out;
  }
  bool timed_out = false;
  const int rc = lookup(host, timeout, timed_out, out.addresses);
  if (rc == 0) return out;
  out.result = timed_out ? AddressCheck::Result::kTimedOut : AddressCheck::Result::kUnresolvable;
  out.reason = timed_out ? fmt::format("no answer within {} ms", timeout.count())
                         : std::string(::gai_strerror(rc));
  return out;
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
          o.nnodes_given = true;
        }}},
      {"node-rank",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.node_rank = detail::int_flag(f, v, 0, kMaxInt, "a non-negative integer");
          o.node_rank_given = true;
        }}},
      {"master-addr",
       {true,
        [&](std::string_view f, std::string_view v) {
          if (v.empty()) detail::bad_value(f, v, "a host name or address");
          o.master_addr = std::string(v);
          o.master_addr_given = true;
        }}},
      {"master-port",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.master_port =
              static_cast<uint16_t>(detail::int_flag(f, v, 0, 65535, "a port number 0-65535"));
          o.master_port_given = true;
        }}},
      {"standalone", {false, [&](std::string_view, std::string_view) { o.standalone = true; }}},
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
      {"store-memory-budget",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.store_memory_budget = detail::store_budget_flag(f, v);
        }}},
      {"max-restarts",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.max_restarts = detail::int_flag(f, v, 0, kMaxInt, "a non-negative integer");
        }}},
      {"grace-period",
       {true,
        [&](std::string_view f, std::string_view v) {
          o.grace_period = detail::seconds_flag(f, v);
          o.grace_period_given = true;
        }}},
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
      {"join-timeout",
       {true, [&](std::string_view f,
                  std::string_view v) { o.join_timeout = detail::seconds_flag(f, v); }}},
      {"node-timeout",
       {true, [&](std::string_view f,
                  std::string_view v) { o.node_timeout = detail::seconds_flag(f, v); }}},
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
          constexpr std::string_view kWant = "a comma-separated list of ranks like 0,3";
          std::set<int> ranks;
          const auto items = detail::split(v, ',');
          for (std::size_t k = 0; k < items.size(); ++k) {
            if (detail::trim(items[k]).empty())
              throw UsageError(
                  fmt::format("invalid value '{}' for --{}: piece {} is empty; expected {}", v, f,
                              k + 1, kWant));
            const auto rank = detail::to_int(detail::trim(items[k]), 0, kMaxInt);
            if (!rank)
              throw UsageError(fmt::format(
                  "invalid value '{}' for --{}: piece {} ('{}') is not a rank (an integer >= 0); "
                  "expected {}",
                  v, f, k + 1, detail::trim(items[k]), kWant));
            ranks.insert(static_cast<int>(*rank));
          }
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
  // With --slurm and no --nnodes the node count comes from Slurm: apply_slurm checks the rank.
  if (o.node_rank >= o.nnodes && !(o.slurm == SlurmMode::kOn && !o.nnodes_given))
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
  // The local ranks are known here for a plain --nproc N (elastic mode on GPUs makes every
  // visible GPU a slot: main checks once it knows them, as for --nproc gpu|cpu|auto).
  // With --slurm and no --nproc the count comes from Slurm's GPUs: main checks then.
  if (o.nproc_mode == NprocMode::kCount && !(o.config && o.device == Device::kCuda) &&
      (o.nproc_given || o.slurm != SlurmMode::kOn))
    check_local_ranks(o, o.nproc);
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
  --slurm                 take --nnodes, --node-rank, the master and the default --nproc
                          from Slurm (gpurun run by srun, one task per node); automatic
                          inside a Slurm step unless --nnodes/--node-rank/--standalone
  --no-slurm              ignore Slurm's environment
  --store-memory-budget SIZE  bytes the store may hold for all clients together (e.g. 2GiB;
                          default min(RAM/8, 4 GiB); 0 = unlimited); a client whose request
                          would exceed it loses its connection
  --device cuda|cpu       slots are GPUs (default cuda) or CPU-only virtual slots

Supervision:
  --max-restarts K        restart the whole worker set at most K times (default 0)
  --grace-period SECONDS  SIGTERM -> SIGKILL delay on teardown (default 30)
  --exit-barrier-timeout SECONDS  with --nnodes > 1: how long node 0 keeps its store up
                          for the other nodes after its own workers succeeded (default 300)
  --join-timeout SECONDS  with --nnodes > 1: how long the start rendezvous waits for every
                          node to join before any worker starts (default 600)
  --node-timeout SECONDS  with --nnodes > 1: node 0 gives up a node whose gpurun sent no
                          heartbeat (every second) for this long (default 30; 0: never)

Preemption (docs/cli.md#preemption):
  --preempt-signal SIG    warning signal turned into a checkpoint request at the workers'
                          next boundary (default USR2; none = plain forwarding off)
  --stop-timeout SECONDS  after SIGTERM, how long runtime workers may take to stop at a
                          boundary before they get SIGTERM (default 30; under Slurm the
                          defaults of this and --grace-period share KillWait - 2 s)
  --requeue               after a stop by SIGTERM or the preempt signal: scontrol requeue
                          $SLURM_JOB_ID and exit 75 when it worked

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
  gpurun status [--json] [--run-id ID] [--pid PID | --run-dir DIR]
                          --pid: the supervisor's pid, when several runs match

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
  srun --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 gpurun ./train   # Slurm

Exit status: 0 when every worker succeeds; the first failing worker's exit code,
or 128+signal when it was killed by a signal; 1 for a launcher error; 2 for a
usage error; 127 when the command cannot be found. See docs/cli.md.
)";
}

}  // namespace gpurun::supervisor
