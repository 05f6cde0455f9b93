#include "control/status.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "control/resize_timeline.hpp"
#include "gpurun/control/decision.hpp"
#include "gpurun/regular_file.hpp"
#include "supervisor/event_log.hpp"

namespace gpurun::control {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

bool pid_alive(int pid) {
  return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

// Start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22), "" if
// unknown. With the pid it names one process for good: a reused pid has another.
std::string process_start_time(int pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const auto close = stat.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  for (int i = 3; i <= 22 && fields >> f; ++i) {
    if (i == 22) return f;
  }
  return "";
}

/// A registry entry or status.json: "" when missing; throws FileError for a FIFO, a device,
/// a directory or a file over 16 MiB (gpurun::read_regular_file).
std::string slurp(const fs::path& p, std::string_view what) {
  const std::optional<FileContent> f = read_regular_file_if_exists(p, kDefaultMaxFileBytes, what);
  return f ? f->bytes : std::string();
}

}  // namespace

RunStatus run_status(const Scheduler& sch) {
  RunStatus st;
  st.elastic = true;
  st.generation = sch.generation();
  st.round = sch.round();
  st.current_active = sch.active();
  st.desired_active = sch.effective_desired();
  st.park_mode = sch.config().park_mode;
  st.last_config_error = sch.last_config_error();
  // A refusal matters only while the config still asks for the pause.
  if (sch.effective_desired().empty()) st.pause_refused = sch.pause_refused();
  st.state_lost = sch.state_lost();
  st.last_decision = sch.last_decision();
  st.late = sch.boundary_wait();
  for (const auto& [gpu, s] : sch.slots())
    st.slots.push_back(
        SlotStatus{gpu, s.state, s.generation, s.rank, s.pid, s.last_boundary, s.reason});
  return st;
}

std::string render_status(const Scheduler& sch, const StatusSnapshot& snap) {
  return render_status(run_status(sch), snap);
}

std::string render_status(const RunStatus& st, const StatusSnapshot& snap) {
  std::string slots = "[";
  bool first = true;
  const EnergyStatus est = snap.energy ? snap.energy() : EnergyStatus{};
  const std::map<int, SlotEnergyStatus>& energy = est.slots;
  for (const SlotStatus& s : st.slots) {
    JsonObject o;
    o.add("gpu", s.gpu);
    if (s.gpu >= 0 && static_cast<size_t>(s.gpu) < snap.physical_gpus.size())
      o.add("physical_gpu", snap.physical_gpus[static_cast<size_t>(s.gpu)]);
    else
      o.add_null("physical_gpu");
    o.add("state", to_string(s.state))
        .add("generation", s.generation)
        .add("rank", s.rank)
        .add("pid", s.pid);
    if (s.last_boundary)
      o.add_raw("last_boundary", JsonObject()
                                     .add("epoch", s.last_boundary->first)
                                     .add("step", s.last_boundary->second)
                                     .str());
    else
      o.add_null("last_boundary");
    o.add("reason", s.reason);
    if (snap.energy) {
      if (auto it = energy.find(s.gpu); it != energy.end()) {
        o.add("power_w", it->second.power_w).add("epoch_energy_j", it->second.epoch_energy_j);
        if (it->second.power_limit_w)
          o.add("power_limit_w", static_cast<int64_t>(*it->second.power_limit_w));
        else
          o.add_null("power_limit_w");
      } else {
        o.add_null("power_w").add_null("epoch_energy_j").add_null("power_limit_w");
      }
    }
    slots += (first ? "" : ",") + o.str();
    first = false;
  }
  slots += "]";
  JsonObject root;
  root.add("run_id", snap.run_id)
      .add("run_dir", snap.run_dir)
      .add("supervisor_pid", snap.supervisor_pid)
      .add("updated", supervisor::EventLog::format_timestamp(std::chrono::system_clock::now()))
      .add("elastic", st.elastic);
  if (snap.config_path.empty())
    root.add_null("config");
  else
    root.add("config", snap.config_path);
  root.add("generation", st.generation);
  if (st.round)
    root.add("round", *st.round);
  else
    root.add_null("round");
  root.add_raw("current_active", ids_json(st.current_active))
      .add_raw("desired_active", ids_json(st.desired_active));
  if (st.park_mode)
    root.add("park_mode", to_string(*st.park_mode));
  else
    root.add_null("park_mode");
  if (st.last_config_error.empty())
    root.add_null("last_config_error");
  else
    root.add("last_config_error", st.last_config_error);
  if (st.pause_refused.empty())
    root.add_null("pause_refused");
  else
    root.add("pause_refused", st.pause_refused);
  if (st.state_lost.empty())
    root.add_null("state_lost");
  else
    root.add("state_lost", st.state_lost);
  if (st.last_decision.empty())
    root.add_null("last_decision");
  else
    root.add_raw("last_decision", st.last_decision);
  if (st.late) {
    // How long: since the round's first report by the clock when the report gave its time,
    // else as the deadline timer counted it (the deadline, then every repeat).
    const BoundaryWait& w = *st.late;
    int64_t late_ms = w.waited.count();
    if (w.first_report_ms > 0) {
      const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
      late_ms = std::max(late_ms, now_ms - w.first_report_ms);
    }
    std::string ranks = "[";
    for (size_t i = 0; i < w.late.size(); ++i)
      ranks += (i ? "," : "") + JsonObject()
                                    .add("gpu", w.late[i].gpu)
                                    .add("rank", w.late[i].rank)
                                    .add("pid", w.late[i].pid)
                                    .str();
    JsonObject l;
    l.add("generation", w.generation).add("round", w.round);
    if (w.boundary)
      l.add_raw("boundary",
                JsonObject().add("epoch", w.boundary->first).add("step", w.boundary->second).str());
    else
      l.add_null("boundary");
    l.add("late_s", static_cast<double>(late_ms) / 1000.0)
        .add("deadline_s", static_cast<double>(w.deadline.count()) / 1000.0)
        .add("reported", static_cast<int64_t>(w.reported))
        .add("of", static_cast<int64_t>(w.of))
        .add_raw("ranks", ranks + "]");
    root.add_raw("late_at_boundary", l.str());
  } else {
    root.add_null("late_at_boundary");
  }
  if (!snap.policy.empty()) root.add_raw("policy", snap.policy);
  if (snap.last_resize.empty())
    root.add_null("last_resize");
  else
    root.add_raw("last_resize", snap.last_resize);
  root.add_raw("slots", slots);
  if (snap.energy) {
    JsonObject e;
    e.add("epochs", est.epochs).add("cost_total_j", est.cost_total_j);
    if (est.threshold_j)
      e.add("threshold_j", *est.threshold_j);
    else
      e.add_null("threshold_j");
    root.add_raw("energy", e.str());
  }
  return root.str();
}

bool write_status_file(const std::string& dir, const std::string& text, std::string& error,
                       FileIdentity* written) {
  const std::string path = dir + "/status.json";
  const std::string tmp = fmt::format("{}/.status.json.{}", dir, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = fmt::format("cannot write '{}': {}", tmp, std::strerror(errno));
    return false;
  }
  const std::string body = text + "\n";
  size_t off = 0;
  while (off < body.size()) {
    ssize_t n = ::write(fd, body.data() + off, body.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error =
          fmt::format("cannot write '{}': {}", tmp, n < 0 ? std::strerror(errno) : "no progress");
      ::close(fd);
      ::unlink(tmp.c_str());  // no half-written temp file left in the run directory
      return false;
    }
    off += static_cast<size_t>(n);
  }
  if (written) {
    // The identity the file will have in place (rename keeps the inode and the mtime).
    if (const std::optional<FileIdentity> id = file_identity(fd)) *written = *id;
  }
  if (::close(fd) != 0) {  // e.g. a deferred NFS write error
    error = fmt::format("cannot write '{}': {}", tmp, std::strerror(errno));
    ::unlink(tmp.c_str());
    return false;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    error = fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno));
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

std::string registry_dir() {
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) return std::string(x) + "/gpurun";
  const char* tmp = std::getenv("TMPDIR");
  return fmt::format("{}/gpurun-{}", tmp && *tmp ? tmp : "/tmp", ::getuid());
}

RunRegistration::RunRegistration(const std::string& run_id, const std::string& run_dir) {
  std::string safe;
  for (char c : run_id)
    safe.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_');
  const std::string dir = registry_dir();
  std::error_code ec;
  fs::create_directories(dir, ec);
  path_ = fmt::format("{}/{}.{}", dir, safe, ::getpid());
  std::string err;
  // The registry entry is small: reuse the atomic writer through a temp name.
  const std::string tmp = path_ + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  out << run_id << "\n" << run_dir << "\n" << process_start_time(::getpid()) << "\n";
  out.close();
  if (!out || ::rename(tmp.c_str(), path_.c_str()) != 0) {
    error_ = fmt::format("cannot register the run in '{}': {}", dir, std::strerror(errno));
    ::unlink(tmp.c_str());
    path_.clear();
  }
}

RunRegistration::~RunRegistration() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

namespace {

struct RunEntry {
  std::string run_id;
  std::string run_dir;
  int pid = 0;
  std::string started;  ///< process start, clock ticks since boot ("" if unknown)
};

/// When a process started (ticks since boot, /proc/<pid>/stat) as local time
/// "2025-01-31 12:00:00"; "unknown" when it cannot be told.
std::string started_text(const std::string& ticks) {
  long long t = 0;
  try {
    t = std::stoll(ticks);
  } catch (const std::exception&) {
    return "unknown";
  }
  std::ifstream in("/proc/stat");
  long long boot = -1;
  for (std::string key; in >> key;) {
    if (key == "btime") {
      in >> boot;
      break;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (boot < 0 || hz <= 0) return "unknown";
  const std::time_t when = static_cast<std::time_t>(boot + t / hz);
  std::tm tm{};
  if (::localtime_r(&when, &tm) == nullptr) return "unknown";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::vector<RunEntry> live_runs() {
  std::vector<RunEntry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(registry_dir(), ec)) {
    const std::string name = e.path().filename().string();
    const auto dot = name.rfind('.');
    if (dot == std::string::npos) continue;
    int pid = 0;
    try {
      pid = std::stoi(name.substr(dot + 1));
    } catch (const std::exception&) {
      continue;
    }
    std::istringstream in;
    try {
      in.str(slurp(e.path(), "the run registration"));
    } catch (const FileError&) {
      continue;  // not one gpurun wrote (a FIFO, a directory): not a run, left alone
    }
    RunEntry r;
    r.pid = pid;
    std::string& started = r.started;
    std::getline(in, r.run_id);
    std::getline(in, r.run_dir);
    std::getline(in, started);
    // Stale: the supervisor was killed (kill -9) and its pid is gone or now names
    // another process, or its run directory is gone. Remove it, best effort.
    const bool live = pid_alive(pid) && !r.run_dir.empty() && fs::exists(r.run_dir, ec) &&
                      (started.empty() || started == process_start_time(pid));
    if (!live) {
      fs::remove(e.path(), ec);
      continue;
    }
    out.push_back(r);
  }
  return out;
}

/// pid -> used GPU memory in MiB from nvidia-smi; nullopt when nvidia-smi is unavailable.
std::optional<std::map<int, long>> gpu_memory_by_pid() {
  FILE* p = ::popen(
      "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null",
      "r");
  if (!p) return std::nullopt;
  std::map<int, long> out;
  char line[256];
  while (std::fgets(line, sizeof line, p)) {
    int pid = 0;
    long mib = 0;
    if (std::sscanf(line, "%d , %ld", &pid, &mib) == 2) out[pid] += mib;
  }
  const int rc = ::pclose(p);
  if (rc != 0) return std::nullopt;
  return out;
}

std::string ids_text(const json::value* v) {
  if (!v || !v->is_array()) return "-";
  std::string s = "[";
  for (size_t i = 0; i < v->as_array().size(); ++i)
    s += (i ? ", " : "") + json::serialize(v->as_array()[i]);
  return s + "]";
}

std::string field_text(const json::object& o, std::string_view k) {
  const json::value* v = o.if_contains(k);
  if (!v || v->is_null()) return "-";
  if (v->is_string()) return std::string(v->as_string());
  if (v->is_double()) {  // fixed point, never JSON's 1.5E5: at most 3 decimals, no trailing 0s
    std::string t = fmt::format("{:.3f}", v->as_double());
    while (t.back() == '0') t.pop_back();
    if (t.back() == '.') t.pop_back();
    return t;
  }
  return json::serialize(*v);
}

void err(const std::string& msg) {
  std::fprintf(stderr, "gpurun: error: %s\n", msg.c_str());
}

}  // namespace

bool take_run_flag(const std::vector<std::string>& args, size_t& i, RunChoice& choice,
                   std::string& error) {
  const std::string& a = args[i];
  auto value = [&](const char* flag) -> std::optional<std::string> {
    if (a.rfind(std::string(flag) + "=", 0) == 0) return a.substr(std::strlen(flag) + 1);
    if (a == flag && i + 1 < args.size()) return args[++i];
    return std::nullopt;
  };
  if (a == "--pid" || a.rfind("--pid=", 0) == 0) {
    const std::optional<std::string> v = value("--pid");
    if (!v) return error = "--pid needs a value", true;
    int n = 0;
    const auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (v->empty() || ec != std::errc{} || p != v->data() + v->size() || n <= 0)
      return error = fmt::format("invalid value '{}' for --pid: expected a process id", *v), true;
    choice.pid = n;
    return true;
  }
  if (a == "--run-id" || a.rfind("--run-id=", 0) == 0) {
    choice.run_id = value("--run-id");
    if (!choice.run_id) error = "--run-id needs a value";
    return true;
  }
  if (a == "--run-dir" || a.rfind("--run-dir=", 0) == 0) {
    choice.run_dir = value("--run-dir");
    if (!choice.run_dir) error = "--run-dir needs a value";
    return true;
  }
  return false;
}

std::optional<std::string> choose_run_dir(const RunChoice& c, std::string& error, int& code) {
  code = 1;
  if (c.run_dir && c.pid) {
    error = "--pid and --run-dir each pick one run; give one of them";
    code = 2;
    return std::nullopt;
  }
  if (c.run_dir) return c.run_dir;
  const auto& run_id = c.run_id;
  const auto& pid = c.pid;
  std::vector<RunEntry> runs;
  for (auto& r : live_runs())
    if ((!run_id || r.run_id == *run_id) && (!pid || r.pid == *pid)) runs.push_back(r);
  if (runs.empty()) {
    std::string which;
    if (run_id) which += fmt::format(" with run id '{}'", *run_id);
    if (pid) which += fmt::format("{} pid {}", run_id ? " and" : " with", *pid);
    error = fmt::format("no running gpurun{} is registered in {}", which, registry_dir());
    return std::nullopt;
  }
  if (runs.size() > 1) {
    std::string list;
    for (const auto& r : runs)
      list += fmt::format("\n  pid {}  run dir {}  started {}{}", r.pid, r.run_dir,
                          started_text(r.started),
                          run_id ? std::string() : fmt::format("  run id {}", r.run_id));
    // Several runs under one id (e.g. the default "none", or a reused --run-id): the id
    // cannot tell them apart, the pid and the run directory can.
    const std::string what =
        run_id ? fmt::format("{} running gpurun jobs share the run id '{}'", runs.size(), *run_id)
               : fmt::format("{} running gpurun jobs are registered", runs.size());
    error = fmt::format("{}; pick one with --pid PID or --run-dir DIR:{}", what, list);
    return std::nullopt;
  }
  return runs.front().run_dir;
}

int status_command(const std::vector<std::string>& args) {
  constexpr const char* kUsage =
      "usage: gpurun status [--json] [--run-id ID] [--pid PID | --run-dir DIR]";
  bool as_json = false;
  RunChoice choice;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::string error;
    if (a == "--json") {
      as_json = true;
    } else if (a == "-h" || a == "--help") {
      std::puts(kUsage);
      return 0;
    } else if (take_run_flag(args, i, choice, error)) {
      if (!error.empty()) return err(error), 2;
    } else {
      err(fmt::format("unknown argument '{}' for gpurun status (see gpurun status --help)", a));
      return 2;
    }
  }
  std::string error;
  int code = 1;
  const std::optional<std::string> run_dir = choose_run_dir(choice, error, code);
  if (!run_dir) {
    err(code == 2 ? fmt::format("{} ({})", error, kUsage) : error);
    return code;
  }
  const fs::path file = fs::path(*run_dir) / "status.json";
  std::string text;
  try {
    text = slurp(file, "the run's status");
  } catch (const FileError& e) {
    err(e.what());
    return 1;
  }
  boost::system::error_code ec;
  json::value root = json::parse(text, ec);
  if (ec || !root.is_object()) {
    err(fmt::format("cannot read '{}': {}", file.string(),
                    text.empty() ? "missing or empty (has the job ended?)" : "not a JSON object"));
    return 1;
  }
  json::object& o = root.as_object();
  const auto mem = gpu_memory_by_pid();
  if (json::value* slots = o.if_contains("slots"); slots && slots->is_array()) {
    for (auto& sv : slots->as_array()) {
      if (!sv.is_object()) continue;
      auto& so = sv.as_object();
      const int64_t pid = so.contains("pid") && so["pid"].is_int64() ? so["pid"].as_int64() : -1;
      if (mem && pid > 0) {
        auto it = mem->find(static_cast<int>(pid));
        so["gpu_memory_mib"] = it == mem->end() ? 0 : it->second;
      } else {
        so["gpu_memory_mib"] = nullptr;
      }
    }
  }
  if (as_json) {
    std::puts(json::serialize(root).c_str());
    return 0;
  }
  std::string out;
  const json::value* elastic = o.if_contains("elastic");
  const bool plain = elastic && elastic->is_bool() && !elastic->as_bool();
  out += fmt::format("run {}  supervisor pid {}  run dir {}{}\n", field_text(o, "run_id"),
                     field_text(o, "supervisor_pid"), field_text(o, "run_dir"),
                     plain ? "  (not elastic: no --config)" : "");
  out += fmt::format("config {}  updated {}\n", field_text(o, "config"), field_text(o, "updated"));
  out += fmt::format("generation {}  round {}  park mode {}\n", field_text(o, "generation"),
                     field_text(o, "round"), field_text(o, "park_mode"));
  out += fmt::format("active: current {}  desired {}\n", ids_text(o.if_contains("current_active")),
                     ids_text(o.if_contains("desired_active")));
  out += fmt::format("last config error: {}\n", field_text(o, "last_config_error"));
  if (const json::value* l = o.if_contains("late_at_boundary"); l && l->is_object()) {
    // A round past [boundary] deadline_s that waits for running ranks (docs/config.md#boundary).
    const json::object& lo = l->as_object();
    std::string who;
    if (const json::value* r = lo.if_contains("ranks"); r && r->is_array())
      for (const auto& rv : r->as_array())
        if (rv.is_object())
          who += fmt::format("{}gpu {} (rank {}, pid {})", who.empty() ? "" : ", ",
                             field_text(rv.as_object(), "gpu"), field_text(rv.as_object(), "rank"),
                             field_text(rv.as_object(), "pid"));
    out += fmt::format(
        "late at boundary round {} of generation {}: {} for {} s ([boundary] deadline_s = {}; {} "
        "of {} ranks reported): running the program's own code, waited for (as DDP would)\n",
        field_text(lo, "round"), field_text(lo, "generation"), who,
        fmt::format("{:.1f}", lo.contains("late_s") && lo.at("late_s").is_number()
                                  ? lo.at("late_s").to_number<double>()
                                  : 0.0),
        field_text(lo, "deadline_s"), field_text(lo, "reported"), field_text(lo, "of"));
  }
  if (const json::value* p = o.if_contains("policy"); p && p->is_object()) {
    const json::object& po = p->as_object();
    std::string leases;
    if (const json::value* l = po.if_contains("leases"); l && l->is_array())
      for (const auto& lv : l->as_array()) {
        if (!lv.is_object()) continue;
        const json::object& lo = lv.as_object();
        const json::value* note = lo.if_contains("note");
        leases += fmt::format(
            "{}GPUs {} until {}{}", leases.empty() ? "" : "; ", ids_text(lo.if_contains("gpus")),
            lo.contains("until") ? field_text(lo, "until") : "reclaimed",
            note && note->is_string() ? fmt::format(" ({})", std::string(note->as_string())) : "");
      }
    out +=
        fmt::format("declared (config.toml) {}  leases: {}\n",
                    ids_text(po.if_contains("declared_active")), leases.empty() ? "none" : leases);
    // Why each declared GPU the job does not train on is out (lent, yielded, given back by
    // scale), and which a policy wanted out but min_gpus kept.
    for (const char* list : {"excluded", "kept"})
      if (const json::value* k = po.if_contains(list); k && k->is_array())
        for (const auto& kv : k->as_array())
          if (kv.is_object())
            out +=
                fmt::format("{}: GPU {}: {}\n", list == std::string_view("kept") ? "kept" : "out",
                            field_text(kv.as_object(), "gpu"), field_text(kv.as_object(), "why"));
    if (po.contains("leases_error"))
      out += fmt::format("leases file error: {}\n", field_text(po, "leases_error"));
    if (const json::value* sc = po.if_contains("scale"); sc && sc->is_object())
      out += fmt::format("scale (auto, among {}): {}\n",
                         ids_text(sc->as_object().if_contains("allowed")),
                         field_text(sc->as_object(), "phase"));
  }
  if (const json::value* p = o.if_contains("pause_refused"); p && p->is_string())
    out += fmt::format("pause refused (training goes on, tried at every boundary): {}\n",
                       std::string(p->as_string()));
  if (const json::value* l = o.if_contains("state_lost"); l && l->is_string())
    out += fmt::format("{}\n", std::string(l->as_string()));
  if (const json::value* r = o.if_contains("last_resize"); r && r->is_object())
    for (const std::string& line : ResizeTimeline::describe(json::serialize(*r)))
      out += line + "\n";
  if (const json::value* e = o.if_contains("energy"); e && e->is_object())
    out += fmt::format(
        "energy: {} epochs finished, Zeus cost so far {} J, early-stop threshold {}\n",
        field_text(e->as_object(), "epochs"), field_text(e->as_object(), "cost_total_j"),
        field_text(e->as_object(), "threshold_j") == "-"
            ? std::string("none")
            : field_text(e->as_object(), "threshold_j") + " J");
  // Energy columns when the run has a monitor (docs/energy.md#status).
  bool with_energy = false;
  if (const json::value* slots = o.if_contains("slots"); slots && slots->is_array())
    for (const auto& sv : slots->as_array())
      with_energy = with_energy || (sv.is_object() && sv.as_object().contains("power_w"));
  const auto energy_cols = [&](const json::object* so) -> std::string {
    if (!with_energy) return "";
    if (!so) return fmt::format(" {:>8} {:>12}", "POWER(W)", "EPOCH E(J)");
    const auto num = [&](const char* key, int digits) -> std::string {
      const json::value* v = so->if_contains(key);
      if (!v || v->is_null()) return "-";
      const double d = v->is_double()  ? v->as_double()
                       : v->is_int64() ? static_cast<double>(v->as_int64())
                                       : 0.0;
      return fmt::format("{:.{}f}", d, digits);
    };
    return fmt::format(" {:>8} {:>12}", num("power_w", 1), num("epoch_energy_j", 0));
  };
  out += fmt::format("{:<4} {:<8} {:<11} {:>4} {:>5} {:>8} {:>9}{}  {}\n", "GPU", "PHYS", "STATE",
                     "GEN", "RANK", "PID", "MEM(MiB)", energy_cols(nullptr), "LAST BOUNDARY");
  if (const json::value* slots = o.if_contains("slots"); slots && slots->is_array()) {
    for (const auto& sv : slots->as_array()) {
      if (!sv.is_object()) continue;
      const auto& so = sv.as_object();
      std::string boundary = "-";
      if (const json::value* b = so.if_contains("last_boundary"); b && b->is_object())
        if (const auto* e = b->as_object().if_contains("epoch"),
            *st = b->as_object().if_contains("step");
            e && st && e->is_int64() && st->is_int64())
          boundary = boundary_text(e->as_int64(), st->as_int64());
      std::string pid = field_text(so, "pid");
      if (pid == "-1") pid = "-";
      out +=
          fmt::format("{:<4} {:<8} {:<11} {:>4} {:>5} {:>8} {:>9}{}  {}\n", field_text(so, "gpu"),
                      field_text(so, "physical_gpu"), field_text(so, "state"),
                      field_text(so, "generation"), field_text(so, "rank"), pid,
                      field_text(so, "gpu_memory_mib"), energy_cols(&so), boundary);
    }
  }
  std::fputs(out.c_str(), stdout);
  return 0;
}

StatusWriter::StatusWriter(boost::asio::io_context& io, std::string dir, Render render,
                           std::function<void(const std::string&)> on_error,
                           std::chrono::milliseconds min_interval)
    : timer_(io),
      dir_(std::move(dir)),
      render_(std::move(render)),
      on_error_(std::move(on_error)),
      min_interval_(min_interval) {}

StatusWriter::~StatusWriter() {
  timer_.cancel();
}

void StatusWriter::publish() {
  dirty_ = true;
  if (armed_) return;
  const auto due = last_write_ + min_interval_;
  if (std::chrono::steady_clock::now() >= due) {
    write_now();
    return;
  }
  armed_ = true;
  timer_.expires_at(due);
  timer_.async_wait([this, alive = std::weak_ptr<int>(alive_)](boost::system::error_code ec) {
    if (ec || alive.expired()) return;
    armed_ = false;
    if (dirty_) write_now();
  });
}

void StatusWriter::flush() {
  if (dirty_) write_now();
}

void StatusWriter::write_now() {
  dirty_ = false;
  last_write_ = std::chrono::steady_clock::now();
  std::string error;
  const std::string path = dir_ + "/status.json";
  if (written_ && !crossed_said_) {
    const std::optional<FileIdentity> now = file_identity(path);
    if (now && *now != *written_ && on_error_) {
      crossed_said_ = true;  // said once: a second writer would otherwise flood the console
      on_error_(
          fmt::format("{} was changed or replaced by another process since gpurun wrote "
                      "it (another gpurun using this run directory, or a hand edit); "
                      "gpurun goes on writing this run's status there",
                      path));
    }
  }
  FileIdentity id;
  if (!write_status_file(dir_, render_(), error, &id)) {
    if (on_error_) on_error_(error);
    return;
  }
  written_ = id;
}

}  // namespace gpurun::control
