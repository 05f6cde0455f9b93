// The fake NVML's state file (launcher/energy/simulated_nvml/simulated_nvml.cpp reads it on every
// call): its format, a parser and a writer shared by the fake library and the tests, and the
// simulation formulas (draw, energy) so a test can compute what the fake will report.
//
// Format: one item per line, '#' starts a comment line, blank lines are ignored.
//
//   t0=1712345678.250000            Unix seconds (CLOCK_REALTIME) the schedules start at;
//                                   stamped by the first process that loads a file without it
//   now=1712345679.250000           a stopped clock: the Unix seconds the fake takes as now,
//                                   moved only by whoever writes the file (advance()); absent:
//                                   CLOCK_REALTIME
//   energy_period_ms=100            the energy counter changes only every this many ms (H200)
//   cuda_order=2,0,1                CUDA ordinal k is NVML index cuda_order[k] (default:
//                                   identity; ignored under CUDA_DEVICE_ORDER=PCI_BUS_ID)
//   energy_reads=0                  nvmlDeviceGetTotalEnergyConsumption calls so far, all
//                                   processes together (written by the fake)
//   gpu 0 uuid=GPU-a0000000-0000-1234-3333-000000000000 name="NVIDIA H200" min_w=200
//       max_w=700 default_w=700 limit_w=700 full_w=600 speed_exp=0.5 draw=0:300,10:600
//       limits=12.5:500               (all on one line)
//   error nvmlDeviceSetPowerManagementLimit 4 [gpu=1]
//   process 1 4242 2048              a compute process (pid 4242, 2048 MiB) on NVML index 1:
//                                    what nvmlDeviceGetComputeRunningProcesses_v3 lists
//
// A `gpu` line per NVML index 0..n-1 (any order, indices contiguous). Watts (W) and seconds
// since t0 (s):
//   limit_w    the power limit at t0;
//   limits     the limits set since then, `<s>:<W>` pairs in time order, appended by the fake
//              on each nvmlDeviceSetPowerManagementLimit (the current limit is the last);
//   draw       the *uncapped* draw, a piecewise-constant schedule `<s>:<W>,…` (0 W before the
//              first time; the last value lasts forever); absent: full_w from t0 on;
//   speed_exp  gpurunFakeNvmlRelativeSpeed = (actual / uncapped) ^ speed_exp;
//   clocks     `<min>:<max>` MHz while the GPU clocks are locked (nvmlDeviceSetGpuLockedClocks;
//              removed by nvmlDeviceResetGpuLockedClocks); absent: not locked;
//   temp       `<ambient °C>:<°C per W>:<τ s>`: the core temperature follows the actual draw
//              with a first-order lag, dT/dt = (ambient + k·draw − T) / τ, T(0) = its steady
//              value for the draw at t0 (temperature_c()); nvmlDeviceGetTemperature reports it
//              rounded down to whole degrees; absent: NVML_ERROR_NOT_SUPPORTED (no sensor).
// The actual draw is min(uncapped(t), limit(t)); the energy counter (mJ) is its integral from
// t0 to now rounded down to a multiple of energy_period_ms. `error <function> <code>` makes
// every call of that NVML or CUDA function fail with that nvmlReturn_t / CUresult (device
// functions only on GPU `gpu=` when given).
//
// Concurrency: readers hold flock(LOCK_SH), writers flock(LOCK_EX) on the file itself and
// rewrite it in place (canonical form: comments are not kept).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpurun::energy::simulated_nvml {

/// One simulated GPU (one `gpu` line).
struct Gpu {
  unsigned index = 0;  ///< NVML index
  std::string uuid;    ///< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string name = "NVIDIA H200";
  double min_w = 200, max_w = 700, default_w = 700;     ///< limit constraints and default, W
  double limit_w = 700;                                 ///< limit at t0, W
  double full_w = 600;                                  ///< uncapped draw when `draw` is empty, W
  double speed_exp = 0.5;                               ///< exponent of gpurunFakeNvmlRelativeSpeed
  std::vector<std::pair<double, double>> draw;          ///< (s since t0, uncapped W), time order
  std::vector<std::pair<double, double>> limits;        ///< (s since t0, W) set since t0
  std::optional<std::pair<unsigned, unsigned>> clocks;  ///< locked GPU clocks (min, max), MHz
  /// `temp`: ambient (°C), °C per W of draw, time constant τ (s); none: no sensor.
  struct Thermal {
    double ambient_c = 30, c_per_w = 0.1, tau_s = 1;
  };
  std::optional<Thermal> temp;
};

/// `error <function> <code> [gpu=<index>]`.
struct ErrorRule {
  std::string function;  ///< e.g. "nvmlDeviceSetPowerManagementLimit", "cuInit"
  int code = 0;          ///< nvmlReturn_t or CUresult returned
  std::optional<unsigned> gpu;
};

/// `process <gpu> <pid> <used_mib>`.
struct Process {
  unsigned gpu = 0;
  unsigned pid = 0;
  uint64_t used_mib = 0;
};

struct State {
  std::vector<Process> processes;
  std::optional<double> t0;   ///< Unix seconds
  std::optional<double> now;  ///< a stopped clock (Unix seconds); nullopt: CLOCK_REALTIME
  unsigned energy_period_ms = 100;
  std::vector<unsigned> cuda_order;  ///< empty: identity
  uint64_t energy_reads = 0;
  std::vector<Gpu> gpus;  ///< indexed by NVML index after parse()
  std::vector<ErrorRule> errors;

  const ErrorRule* error_for(std::string_view function, std::optional<unsigned> gpu) const {
    for (const auto& e : errors)
      if (e.function == function && (!e.gpu || (gpu && *e.gpu == *gpu))) return &e;
    return nullptr;
  }
};

/// A distinct UUID per index whose first hex digits differ: "GPU-a0000000-…", "GPU-a1010101-…";
/// the middle groups are this process's pid, so test programs running at the same time never
/// share a GPU (the power-limit lock is machine-wide, keyed by UUID).
inline std::string test_uuid(unsigned index) {
  char buf[64];
  const auto pid = static_cast<unsigned>(::getpid());
  std::snprintf(buf, sizeof buf, "GPU-%08x-%04x-%04x-3333-%012x", 0xa0000000u + index * 0x01010101u,
                (pid >> 16) & 0xffffu, pid & 0xffffu, index);
  return buf;
}

/// The 16 bytes of `uuid` when it is a GPU UUID as NVML prints it:
/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower-case hex (the form gpurun builds from
/// cuDeviceGetUuid's bytes and then asks NVML for, gpu_map.cpp); nullopt for anything else.
/// The rule of a `gpu` line's uuid: cuDeviceGetUuid reports these bytes, --simulate-gpus
/// refuses a file whose uuid has none.
inline std::optional<std::array<unsigned char, 16>> uuid_bytes(std::string_view uuid) {
  constexpr std::string_view kPrefix = "GPU-";
  if (uuid.size() != kPrefix.size() + 36 || uuid.substr(0, kPrefix.size()) != kPrefix)
    return std::nullopt;
  const auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  std::array<unsigned char, 16> out{};
  size_t n = 0;
  for (size_t i = kPrefix.size(); i < uuid.size();) {
    const size_t at = i - kPrefix.size();  // dashes at 8, 13, 18, 23 of the 36
    if (at == 8 || at == 13 || at == 18 || at == 23) {
      if (uuid[i++] != '-') return std::nullopt;
      continue;
    }
    const int hi = hex(uuid[i]), lo = hex(uuid[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[n++] = static_cast<unsigned char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

/// `n` H200-like GPUs (200–700 W, limit 700 W, 600 W uncapped), t0 = `t0`.
inline State h200s(unsigned n, std::optional<double> t0 = std::nullopt) {
  State s;
  s.t0 = t0;
  for (unsigned i = 0; i < n; ++i) {
    Gpu g;
    g.index = i;
    g.uuid = test_uuid(i);
    s.gpus.push_back(g);
  }
  return s;
}

/// Unix seconds now (CLOCK_REALTIME), the clock of t0.
inline double unix_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

/// The fake's time now, Unix seconds: its stopped clock when it has one, else unix_now().
inline double now_s(const State& s) {
  return s.now ? *s.now : unix_now();
}

// ---- simulation ----

/// Uncapped draw at `s` seconds since t0, W.
inline double uncapped_w(const Gpu& g, double s) {
  if (g.draw.empty()) return s >= 0 ? g.full_w : 0.0;
  double w = 0;
  for (const auto& [t, v] : g.draw)
    if (s >= t) w = v;
  return w;
}

/// Power limit in force at `s` seconds since t0, W.
inline double limit_at_w(const Gpu& g, double s) {
  double w = g.limit_w;
  for (const auto& [t, v] : g.limits)
    if (s >= t) w = v;
  return w;
}

inline double current_limit_w(const Gpu& g) {
  return g.limits.empty() ? g.limit_w : g.limits.back().second;
}

/// Actual draw at `s` seconds since t0: min(uncapped, limit), W.
inline double actual_w(const Gpu& g, double s) {
  return std::min(uncapped_w(g, s), limit_at_w(g, s));
}

/// Exact integral of actual_w over [0, s], J.
inline double energy_j(const Gpu& g, double s) {
  if (s <= 0) return 0;
  std::vector<double> cuts{0.0, s};
  for (const auto& p : g.draw)
    if (p.first > 0 && p.first < s) cuts.push_back(p.first);
  for (const auto& p : g.limits)
    if (p.first > 0 && p.first < s) cuts.push_back(p.first);
  std::sort(cuts.begin(), cuts.end());
  double e = 0;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) e += actual_w(g, cuts[i]) * (cuts[i + 1] - cuts[i]);
  return e;
}

/// What nvmlDeviceGetTotalEnergyConsumption reports at `s` seconds since t0, mJ: the integral
/// up to the last multiple of `period_ms`.
inline uint64_t counter_mj(const Gpu& g, double s, unsigned period_ms) {
  if (s <= 0) return 0;
  const double p = std::max(1u, period_ms) / 1000.0;
  const double q = std::floor(s / p + 1e-9) * p;
  return static_cast<uint64_t>(std::llround(energy_j(g, q) * 1000.0));
}

/// The core temperature at `s` seconds since t0, °C (exact for the piecewise-constant draw:
/// each segment moves T toward ambient + k·draw by 1 − exp(−length/τ)); nullopt without `temp`.
inline std::optional<double> temperature_c(const Gpu& g, double s) {
  if (!g.temp) return std::nullopt;
  const Gpu::Thermal& th = *g.temp;
  const auto steady = [&](double at) { return th.ambient_c + th.c_per_w * actual_w(g, at); };
  double t = steady(0);
  if (s <= 0) return t;
  std::vector<double> cuts{0.0, s};
  for (const auto& p : g.draw)
    if (p.first > 0 && p.first < s) cuts.push_back(p.first);
  for (const auto& p : g.limits)
    if (p.first > 0 && p.first < s) cuts.push_back(p.first);
  std::sort(cuts.begin(), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const double target = steady(cuts[i]);
    t = target + (t - target) * std::exp(-(cuts[i + 1] - cuts[i]) / std::max(th.tau_s, 1e-9));
  }
  return t;
}

/// (actual / uncapped) ^ speed_exp at `s`; 1 when uncapped is 0.
inline double relative_speed(const Gpu& g, double s) {
  const double u = uncapped_w(g, s);
  if (u <= 0) return 1.0;
  return std::pow(actual_w(g, s) / u, g.speed_exp);
}

// ---- text form ----

namespace detail {

inline std::string fmt_num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.12g", v);
  return buf;
}

inline std::vector<std::string> split_words(std::string_view line, size_t lineno) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i >= line.size()) break;
    std::string w;
    bool quoted = false;
    while (i < line.size() && (quoted || (line[i] != ' ' && line[i] != '\t'))) {
      if (line[i] == '"') {
        quoted = !quoted;
      } else {
        w += line[i];
      }
      ++i;
    }
    if (quoted)
      throw std::runtime_error("simulated GPUs state line " + std::to_string(lineno) +
                               ": unterminated quote");
    out.push_back(std::move(w));
  }
  return out;
}

inline double to_num(const std::string& v, size_t lineno, std::string_view what) {
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno != 0)
    throw std::runtime_error("simulated GPUs state line " + std::to_string(lineno) + ": " +
                             std::string(what) + " '" + v + "' is not a number");
  return d;
}

inline std::vector<std::pair<double, double>> to_schedule(const std::string& v, size_t lineno,
                                                          std::string_view what) {
  std::vector<std::pair<double, double>> out;
  size_t start = 0;
  while (start < v.size()) {
    size_t end = v.find(',', start);
    if (end == std::string::npos) end = v.size();
    const std::string item = v.substr(start, end - start);
    const size_t colon = item.find(':');
    if (colon == std::string::npos)
      throw std::runtime_error("simulated GPUs state line " + std::to_string(lineno) + ": " +
                               std::string(what) + " item '" + item + "' is not <s>:<W>");
    out.emplace_back(to_num(item.substr(0, colon), lineno, what),
                     to_num(item.substr(colon + 1), lineno, what));
    start = end + 1;
  }
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].first < out[i - 1].first)
      throw std::runtime_error("simulated GPUs state line " + std::to_string(lineno) + ": " +
                               std::string(what) + " times must not decrease");
  return out;
}

inline std::string from_schedule(const std::vector<std::pair<double, double>>& s) {
  std::string out;
  for (const auto& [t, w] : s) {
    if (!out.empty()) out += ',';
    // Times round-trip exactly: a limit set at the stopped clock's `now` is in force at now.
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", t);
    out += std::string(buf) + ":" + fmt_num(w);
  }
  return out;
}

}  // namespace detail

/// Parses the text of a state file. Throws std::runtime_error naming the line.
inline State parse(std::string_view text) {
  using detail::to_num;
  State s;
  size_t lineno = 0, pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++lineno;
    const auto words = detail::split_words(line, lineno);
    if (words.empty() || words[0][0] == '#') continue;
    const std::string& w0 = words[0];
    auto bad = [&](const std::string& why) {
      return std::runtime_error("simulated GPUs state line " + std::to_string(lineno) + ": " + why);
    };
    if (w0 == "gpu") {
      if (words.size() < 2) throw bad("gpu needs an index");
      Gpu g;
      g.index = static_cast<unsigned>(to_num(words[1], lineno, "gpu index"));
      for (size_t i = 2; i < words.size(); ++i) {
        const size_t eq = words[i].find('=');
        if (eq == std::string::npos) throw bad("'" + words[i] + "' is not key=value");
        const std::string k = words[i].substr(0, eq), v = words[i].substr(eq + 1);
        if (k == "uuid")
          g.uuid = v;
        else if (k == "name")
          g.name = v;
        else if (k == "min_w")
          g.min_w = to_num(v, lineno, k);
        else if (k == "max_w")
          g.max_w = to_num(v, lineno, k);
        else if (k == "default_w")
          g.default_w = to_num(v, lineno, k);
        else if (k == "limit_w")
          g.limit_w = to_num(v, lineno, k);
        else if (k == "full_w")
          g.full_w = to_num(v, lineno, k);
        else if (k == "speed_exp")
          g.speed_exp = to_num(v, lineno, k);
        else if (k == "draw")
          g.draw = detail::to_schedule(v, lineno, k);
        else if (k == "limits")
          g.limits = detail::to_schedule(v, lineno, k);
        else if (k == "clocks") {
          const auto colon = v.find(':');
          if (colon == std::string::npos) throw bad("clocks= needs <min>:<max>");
          g.clocks = std::make_pair(static_cast<unsigned>(to_num(v.substr(0, colon), lineno, k)),
                                    static_cast<unsigned>(to_num(v.substr(colon + 1), lineno, k)));
        } else if (k == "temp") {
          const auto a = v.find(':'), b = a == std::string::npos ? a : v.find(':', a + 1);
          if (b == std::string::npos) throw bad("temp= needs <ambient>:<c_per_w>:<tau_s>");
          g.temp = Gpu::Thermal{to_num(v.substr(0, a), lineno, k),
                                to_num(v.substr(a + 1, b - a - 1), lineno, k),
                                to_num(v.substr(b + 1), lineno, k)};
        } else
          throw bad("unknown gpu key '" + k + "'");
      }
      if (g.uuid.empty()) throw bad("gpu " + std::to_string(g.index) + " has no uuid=");
      s.gpus.push_back(std::move(g));
    } else if (w0 == "process") {
      if (words.size() != 4) throw bad("process needs <gpu> <pid> <used_mib>");
      s.processes.push_back({static_cast<unsigned>(to_num(words[1], lineno, "gpu")),
                             static_cast<unsigned>(to_num(words[2], lineno, "pid")),
                             static_cast<uint64_t>(to_num(words[3], lineno, "used_mib"))});
    } else if (w0 == "error") {
      if (words.size() < 3) throw bad("error needs <function> <code>");
      ErrorRule e;
      e.function = words[1];
      e.code = static_cast<int>(to_num(words[2], lineno, "error code"));
      for (size_t i = 3; i < words.size(); ++i) {
        if (words[i].rfind("gpu=", 0) != 0) throw bad("unknown error option '" + words[i] + "'");
        e.gpu = static_cast<unsigned>(to_num(words[i].substr(4), lineno, "gpu"));
      }
      s.errors.push_back(std::move(e));
    } else {
      const size_t eq = w0.find('=');
      if (eq == std::string::npos || words.size() != 1) throw bad("unknown line '" + w0 + "'");
      const std::string k = w0.substr(0, eq), v = w0.substr(eq + 1);
      if (k == "t0") {
        s.t0 = to_num(v, lineno, k);
      } else if (k == "now") {
        s.now = to_num(v, lineno, k);
      } else if (k == "energy_period_ms") {
        s.energy_period_ms = static_cast<unsigned>(to_num(v, lineno, k));
      } else if (k == "energy_reads") {
        s.energy_reads = static_cast<uint64_t>(to_num(v, lineno, k));
      } else if (k == "cuda_order") {
        size_t start = 0;
        while (start < v.size()) {
          size_t end = v.find(',', start);
          if (end == std::string::npos) end = v.size();
          s.cuda_order.push_back(
              static_cast<unsigned>(to_num(v.substr(start, end - start), lineno, k)));
          start = end + 1;
        }
      } else {
        throw bad("unknown key '" + k + "'");
      }
    }
  }
  std::sort(s.gpus.begin(), s.gpus.end(),
            [](const Gpu& a, const Gpu& b) { return a.index < b.index; });
  for (size_t i = 0; i < s.gpus.size(); ++i)
    if (s.gpus[i].index != i)
      throw std::runtime_error("simulated GPUs state: gpu indices must be 0.." +
                               std::to_string(s.gpus.size() - 1) + ", " + std::to_string(i) +
                               " is missing");
  if (!s.cuda_order.empty()) {
    std::vector<unsigned> sorted = s.cuda_order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i)
      if (sorted.size() != s.gpus.size() || sorted[i] != i)
        throw std::runtime_error("simulated GPUs state: cuda_order must be a permutation of 0.." +
                                 std::to_string(s.gpus.size() - 1));
  }
  return s;
}

/// The canonical text of `s` (what the fake writes back).
inline std::string serialize(const State& s) {
  std::string out =
      "# gpurun simulated GPUs (format: launcher/energy/simulated_nvml/simulated_nvml_state.hpp)\n";
  if (s.t0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "t0=%.6f\n", *s.t0);
    out += buf;
  }
  if (s.now) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "now=%.6f\n", *s.now);
    out += buf;
  }
  out += "energy_period_ms=" + std::to_string(s.energy_period_ms) + "\n";
  if (!s.cuda_order.empty()) {
    out += "cuda_order=";
    for (size_t i = 0; i < s.cuda_order.size(); ++i)
      out += (i ? "," : "") + std::to_string(s.cuda_order[i]);
    out += "\n";
  }
  out += "energy_reads=" + std::to_string(s.energy_reads) + "\n";
  using detail::fmt_num;
  for (const auto& g : s.gpus) {
    out += "gpu " + std::to_string(g.index) + " uuid=" + g.uuid + " name=\"" + g.name +
           "\" min_w=" + fmt_num(g.min_w) + " max_w=" + fmt_num(g.max_w) +
           " default_w=" + fmt_num(g.default_w) + " limit_w=" + fmt_num(g.limit_w) +
           " full_w=" + fmt_num(g.full_w) + " speed_exp=" + fmt_num(g.speed_exp);
    if (!g.draw.empty()) out += " draw=" + detail::from_schedule(g.draw);
    if (!g.limits.empty()) out += " limits=" + detail::from_schedule(g.limits);
    if (g.clocks)
      out += " clocks=" + std::to_string(g.clocks->first) + ":" + std::to_string(g.clocks->second);
    if (g.temp)
      out += " temp=" + fmt_num(g.temp->ambient_c) + ":" + fmt_num(g.temp->c_per_w) + ":" +
             fmt_num(g.temp->tau_s);
    out += "\n";
  }
  for (const auto& p : s.processes)
    out += "process " + std::to_string(p.gpu) + " " + std::to_string(p.pid) + " " +
           std::to_string(p.used_mib) + "\n";
  for (const auto& e : s.errors) {
    out += "error " + e.function + " " + std::to_string(e.code);
    if (e.gpu) out += " gpu=" + std::to_string(*e.gpu);
    out += "\n";
  }
  return out;
}

// ---- the file, under flock ----

namespace detail {

/// An open, flock()ed state file; unlocked and closed by the destructor.
class LockedFile {
 public:
  LockedFile(const std::string& path, bool exclusive, bool create) {
    fd_ = ::open(path.c_str(), (exclusive ? O_RDWR : O_RDONLY) | O_CLOEXEC | (create ? O_CREAT : 0),
                 0644);
    if (fd_ < 0)
      throw std::runtime_error("simulated GPUs state file " + path +
                               " cannot be opened: " + std::strerror(errno));
    while (::flock(fd_, exclusive ? LOCK_EX : LOCK_SH) != 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd_);
      throw std::runtime_error("simulated GPUs state file " + path +
                               " cannot be locked: " + std::strerror(e));
    }
  }
  ~LockedFile() { ::close(fd_); }  // closing releases the lock
  LockedFile(const LockedFile&) = delete;
  LockedFile& operator=(const LockedFile&) = delete;

  std::string read_all() const {
    std::string text;
    char buf[4096];
    off_t off = 0;
    for (;;) {
      const ssize_t n = ::pread(fd_, buf, sizeof buf, off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw std::runtime_error(std::string("simulated GPUs state read: ") + std::strerror(errno));
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
      off += n;
    }
    return text;
  }

  /// Replaces the content with `text`, safe against a SIGKILL of the writer (gpurun is killed
  /// in tests while its NVML writes): never a truncated, empty file in between. A shorter text
  /// is padded with empty lines (which parse() skips) to the old length and written in place
  /// over the old one; the file is then cut to the text's length.
  void write_all(std::string text) const {
    struct stat st {};
    const size_t real = text.size();
    if (::fstat(fd_, &st) == 0 && static_cast<size_t>(st.st_size) > text.size())
      text.append(static_cast<size_t>(st.st_size) - text.size(), '\n');
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n =
          ::pwrite(fd_, text.data() + done, text.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw std::runtime_error(std::string("simulated GPUs state write: ") +
                                 std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    if (::ftruncate(fd_, static_cast<off_t>(real)) != 0)
      throw std::runtime_error(std::string("simulated GPUs state truncate: ") +
                               std::strerror(errno));
  }

 private:
  int fd_ = -1;
};

}  // namespace detail

/// Reads and parses `path` under a shared lock.
inline State read_state(const std::string& path) {
  detail::LockedFile f(path, false, false);
  return parse(f.read_all());
}

/// Replaces `path` (created if missing) with `s` under an exclusive lock.
inline void write_state(const std::string& path, const State& s) {
  detail::LockedFile f(path, true, true);
  f.write_all(serialize(s));
}

/// Read-modify-write under one exclusive lock: `change(State&)` edits the state.
template <typename F>
void update_state(const std::string& path, F&& change) {
  detail::LockedFile f(path, true, false);
  State s = parse(f.read_all());
  change(s);
  f.write_all(serialize(s));
}

/// Moves the stopped clock of the file at `path` forward by `seconds` (the file must have
/// `now`); returns the new time. What the fake reports follows at once, with no waiting.
inline double advance(const std::string& path, double seconds) {
  double now = 0;
  update_state(path, [&](State& s) {
    if (!s.now)
      throw std::runtime_error("simulated GPUs state " + path + " has no stopped clock (now=)");
    now = *s.now += seconds;
  });
  return now;
}

/// The current power limit of NVML index `index` in the file, W.
inline double current_limit_w(const std::string& path, unsigned index) {
  const State s = read_state(path);
  if (index >= s.gpus.size())
    throw std::runtime_error("simulated GPUs state " + path + " has no gpu " +
                             std::to_string(index));
  return current_limit_w(s.gpus[index]);
}

/// GPU `index`'s locked clocks "min:max" (MHz) in the file at `path`, or "" when not locked.
inline std::string current_clocks(const std::string& path, unsigned index) {
  const State s = read_state(path);
  if (index >= s.gpus.size())
    throw std::runtime_error("simulated GPUs state " + path + " has no gpu " +
                             std::to_string(index));
  const auto& c = s.gpus[index].clocks;
  return c ? std::to_string(c->first) + ":" + std::to_string(c->second) : "";
}

}  // namespace gpurun::energy::simulated_nvml
