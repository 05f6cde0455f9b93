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
#include "supervisor/asio_clock.hpp"
#include "supervisor/event_log.hpp"

namespace gpurun::control {

namespace fs = std::filesystem;
namespace json = boost::json;

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

WouldDecideStatus would_decide_status(const DecisionOutcome& out,
                                      const std::map<int, SlotInfo>& slots) {
  WouldDecideStatus w;
  w.failed = out.failed;
  for (const DecisionReason& r : out.reasons) w.reasons.push_back(r.text);
  if (!out.decision) {
    w.kind = "state_lost";
    w.summary = "the training state is lost: " + out.state_lost;
    return w;
  }
  const Decision& d = *out.decision;
  w.kind = std::string(to_string(d.kind));
  if (d.kind == Decision::Kind::kSnapshot) {
    w.summary = fmt::format("pause (gpu {} writes the pause snapshot first)", d.state_source.gpu);
    return w;
  }
  w.active = d.active;
  if (d.kind == Decision::Kind::kContinue) {
    w.summary = fmt::format("continue with [{}]", join_ids(d.active, ", "));
    return w;
  }
  w.joiners = d.joiners;
  w.leavers = d.leavers;
  w.summary = d.active.empty() ? std::string("pause")
                               : fmt::format("resize to [{}]", join_ids(d.active, ", "));
  std::vector<std::string> parts;
  for (int gpu : d.joiners) {
    const auto it = slots.find(gpu);
    const char* how = "spawned";
    if (it != slots.end() && it->second.state == SlotState::kWarming)
      how = "warm joiner ready";
    else if (it != slots.end() && it->second.pid >= 0)
      how = "woken";
    parts.push_back(fmt::format("[{}] joins ({})", gpu, how));
  }
  if (!d.leavers.empty()) parts.push_back(fmt::format("[{}] leaves", join_ids(d.leavers, ", ")));
  if (!d.failed.empty()) parts.push_back(fmt::format("[{}] failed", join_ids(d.failed, ", ")));
  for (size_t i = 0; i < parts.size(); ++i) w.summary += (i ? ", " : ": ") + parts[i];
  return w;
}

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
  if (const std::optional<DecisionOutcome> out = sch.would_decide())
    st.would_decide = would_decide_status(*out, sch.slots());
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
  if (st.would_decide) {
    const WouldDecideStatus& w = *st.would_decide;
    std::string reasons = "[";
    for (size_t i = 0; i < w.reasons.size(); ++i)
      reasons += (i ? "," : "") + json::serialize(json::value(w.reasons[i]));
    root.add_raw("would_decide", JsonObject()
                                     .add("kind", w.kind)
                                     .add_raw("active", ids_json(w.active))
                                     .add_raw("joiners", ids_json(w.joiners))
                                     .add_raw("leavers", ids_json(w.leavers))
                                     .add_raw("failed", ids_json(w.failed))
                                     .add_raw("reasons", reasons + "]")
                                     .add("summary", w.summary)
                                     .str());
  } else {
    root.add_null("would_decide");
  }
  if (!snap.policy.empty()) root.add_raw("policy", snap.policy);
  if (!snap.nodes.empty()) root.add_raw("nodes", snap.nodes);
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

StatusWriter::StatusWriter(boost::asio::io_context& io, std::string dir, Render render,
                           std::function<void(const std::string&)> on_error,
                           std::chrono::milliseconds min_interval, gpurun::Clock* clock)
    : own_clock_(clock ? nullptr : std::make_unique<supervisor::AsioClock>(io)),
      clock_(clock ? *clock : *own_clock_),
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
  const auto now = clock_.now();
  if (now >= due) {
    write_now();
    return;
  }
  armed_ = true;
  timer_ = clock_.schedule_after(due - now, [this, alive = std::weak_ptr<int>(alive_)] {
    if (alive.expired()) return;
    armed_ = false;
    if (dirty_) write_now();
  });
}

void StatusWriter::flush() {
  if (dirty_) write_now();
}

void StatusWriter::write_now() {
  dirty_ = false;
  last_write_ = clock_.now();
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
