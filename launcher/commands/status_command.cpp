// `gpurun status`: the registered runs and their status.json, and the --run-id / --pid /
// --run-dir choice the other commands share.
#include "commands/status_command.hpp"

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
#include "control/status.hpp"
#include "gpurun/control/decision.hpp"
#include "gpurun/helper_process.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::commands {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

using control::process_start_time;
using control::registry_dir;

bool pid_alive(int pid) {
  return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

/// A registry entry or status.json: "" when missing; throws FileError for a FIFO, a device,
/// a directory or a file over 16 MiB (gpurun::read_regular_file).
std::string slurp(const fs::path& p, std::string_view what) {
  const std::optional<FileContent> f = read_regular_file_if_exists(p, kDefaultMaxFileBytes, what);
  return f ? f->bytes : std::string();
}

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
  const std::optional<std::string> text = output_of(
      {"nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"});
  if (!text) return std::nullopt;
  std::map<int, long> out;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    int pid = 0;
    long mib = 0;
    if (std::sscanf(line.c_str(), "%d , %ld", &pid, &mib) == 2) out[pid] += mib;
  }
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

namespace {
/// Adds each slot's "gpu_memory_mib" (null when the GPUs' memory cannot be read).
void add_gpu_memory(json::object& o) {
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
}

/// "at the next boundary: ..." from status.json's would_decide (docs/cli.md#gpurun-status):
/// what the next boundary would decide now, with the reasons; "—" when none can be computed.
std::string would_decide_line(const json::object& o) {
  const json::value* w = o.if_contains("would_decide");
  if (!w || !w->is_object()) return "at the next boundary: \u2014\n";
  const json::object& wo = w->as_object();
  std::string reasons;
  if (const json::value* r = wo.if_contains("reasons"); r && r->is_array())
    for (const auto& rv : r->as_array())
      if (rv.is_string()) reasons += (reasons.empty() ? "" : "; ") + std::string(rv.as_string());
  return fmt::format("at the next boundary: {}{}\n", field_text(wo, "summary"),
                     reasons.empty() ? "" : " (" + reasons + ")");
}

/// A node > 0 of an elastic job over several nodes (its status.json has "node"): this node's
/// part; node 0 holds the job's generation, decisions and every node's slots.
std::string node_summary_text(const json::object& o, const json::object& node) {
  std::string out = fmt::format("run {}  supervisor pid {}  run dir {}\n", field_text(o, "run_id"),
                                field_text(o, "supervisor_pid"), field_text(o, "run_dir"));
  out += fmt::format("config {}  updated {}\n", field_text(o, "config"), field_text(o, "updated"));
  const std::string why = field_text(node, "why");
  out += fmt::format(
      "node {} of an elastic job over several nodes: {}{}; node 0's gpurun (store at {}) decides "
      "for the job: `gpurun status` on node 0's host shows every node's slots and the decisions\n",
      field_text(node, "node"), field_text(node, "state"),
      why.empty() || why == "-" ? "" : " (" + why + ")", field_text(node, "node0"));
  out += fmt::format("generation {} as node 0 last told this node: active {}\n",
                     field_text(node, "generation"), ids_text(node.if_contains("active")));
  return out;
}

/// The lines above the slot table: the run, its generation, policy, leases and energy.
std::string summary_text(const json::object& o) {
  if (const json::value* n = o.if_contains("node"); n && n->is_object())
    return node_summary_text(o, n->as_object());
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
  if (!plain) out += would_decide_line(o);  // a plain run decides nothing
  if (const json::value* n = o.if_contains("nodes"); n && n->is_array()) {
    // An elastic job over several nodes (docs/cli.md#elastic-nodes): node 0 runs this status.
    std::string nodes;
    for (const auto& nv : n->as_array()) {
      if (!nv.is_object()) continue;
      const json::object& no = nv.as_object();
      // A lost node says why (its store connection closed, or no heartbeat for how long).
      const std::string why = no.contains("lost") ? " (" + field_text(no, "lost") + ")" : "";
      nodes += fmt::format("\n  node {} ({}, gpurun pid {}): {}{}, slots {}, offers {}",
                           field_text(no, "node"), field_text(no, "host"), field_text(no, "pid"),
                           field_text(no, "state"), why, ids_text(no.if_contains("slots")),
                           ids_text(no.if_contains("offer")));
    }
    out += fmt::format("other nodes ({}; slot k*1000+i is node k's GPU i):{}\n",
                       n->as_array().size(), nodes.empty() ? " none yet" : nodes);
  }
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
  return out;
}

/// The slot table, one line a GPU, with energy columns when the run has a monitor.
std::string slot_table(const json::object& o) {
  std::string out;
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
  return out;
}
}  // namespace

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
      if (!error.empty()) return command_error(error), 2;
    } else {
      command_error(
          fmt::format("unknown argument '{}' for gpurun status (see gpurun status --help)", a));
      return 2;
    }
  }
  std::string error;
  int code = 1;
  const std::optional<std::string> run_dir = choose_run_dir(choice, error, code);
  if (!run_dir) {
    command_error(code == 2 ? fmt::format("{} ({})", error, kUsage) : error);
    return code;
  }
  const fs::path file = fs::path(*run_dir) / "status.json";
  std::string text;
  try {
    text = slurp(file, "the run's status");
  } catch (const FileError& e) {
    command_error(e.what());
    return 1;
  }
  boost::system::error_code ec;
  json::value root = json::parse(text, ec);
  if (ec || !root.is_object()) {
    command_error(
        fmt::format("cannot read '{}': {}", file.string(),
                    text.empty() ? "missing or empty (has the job ended?)" : "not a JSON object"));
    return 1;
  }
  json::object& o = root.as_object();
  add_gpu_memory(o);
  if (as_json) {
    std::puts(json::serialize(root).c_str());
    return 0;
  }
  const std::string out = summary_text(o) + slot_table(o);
  std::fputs(out.c_str(), stdout);
  return 0;
}

void command_error(const std::string& msg) {
  std::fprintf(stderr, "gpurun: error: %s\n", msg.c_str());
}

}  // namespace gpurun::commands
