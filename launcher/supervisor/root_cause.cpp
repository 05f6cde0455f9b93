#include "supervisor/root_cause.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>

#include <fmt/format.h>

#include "gpurun/unique_fd.hpp"

namespace gpurun::supervisor {
namespace {

/// What a collective or the store says when a peer went away (Gloo and NCCL, torch 1.13 -
/// 2.11). The same marks as worker_runtime/python/gpurun/_comm.py's _COMM_FAILURE_MARKS, with
/// the exception names torch gives them.
constexpr std::array<std::string_view, 16> kTeardownMarks = {
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Connection refused",
    "NCCL communicator was aborted",
    "NCCL error",
    "DistNetworkError",
    "DistBackendError",
    "Socket Timeout",
    "failed to recv",
    "failed to send",
    "abandoned by gpurun",
    "Timed out",
    "timed out",
    "ECONNRESET",
    "EPIPE",
};

/// The error text a record is judged by: its own error file's message, else its stderr.
std::string_view error_text(const FailureRecord& r) {
  if (r.report && r.report->problem.empty()) return r.report->message;
  return r.stderr_tail;
}

/// The last non-empty line of `text` (a traceback's last line is its error).
std::string_view last_line(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.remove_suffix(1);
  const std::size_t nl = text.rfind('\n');
  return nl == std::string_view::npos ? text : text.substr(nl + 1);
}

bool has_report(const FailureRecord& r) {
  return r.report && r.report->problem.empty();
}

}  // namespace

bool is_teardown_error(std::string_view text) {
  // A traceback names many things; its last line is the error that ended the process.
  const std::string_view error = last_line(text);
  if (error.find("DataLoader") != std::string_view::npos) return false;  // its own timeout
  return std::any_of(kTeardownMarks.begin(), kTeardownMarks.end(),
                     [&](std::string_view m) { return error.find(m) != std::string_view::npos; });
}

std::string error_line(const FailureRecord& r) {
  const std::string_view l = last_line(error_text(r));
  if (l.size() <= 200) return std::string(l);
  std::size_t from = l.size() - 197;
  while (from < l.size() && (static_cast<unsigned char>(l[from]) & 0xC0) == 0x80) ++from;
  return "..." + std::string(l.substr(from));
}

std::string tidy_message(std::string_view message) {
  while (!message.empty() && (message.back() == ' ' || message.back() == '\n' ||
                              message.back() == '\r' || message.back() == '\t'))
    message.remove_suffix(1);
  if (!message.empty() && message.back() == ':' && message.find('\n') == std::string_view::npos)
    message.remove_suffix(1);
  return std::string(message);
}

bool has_teardown_error(const FailureRecord& r) {
  return is_teardown_error(error_text(r));
}

WallClock::time_point failed_at(const FailureRecord& r) {
  if (has_report(r) && r.report->written_at) return std::min(*r.report->written_at, r.reaped_at);
  return r.reaped_at;
}

bool is_own_failure(const FailureRecord& r, std::optional<WallClock::time_point> teardown_at) {
  if (r.status.success()) return false;
  if (!r.after_teardown) return true;
  const bool stopped_by_gpurun = r.status.signal == SIGTERM || r.status.signal == SIGKILL;
  if (!stopped_by_gpurun) return true;  // its own exit code, or a crash (SIGSEGV, SIGABRT)
  // Killed by gpurun's teardown: its own failure only if its error file came before it.
  return has_report(r) && r.report->written_at && teardown_at &&
         *r.report->written_at <= *teardown_at;
}

std::size_t choose_root_cause(const std::vector<FailureRecord>& records,
                              std::optional<WallClock::time_point> teardown_at,
                              std::size_t first_observed) {
  std::vector<std::size_t> own;
  for (std::size_t i = 0; i < records.size(); ++i)
    if (is_own_failure(records[i], teardown_at)) own.push_back(i);
  if (own.empty()) return first_observed;
  std::stable_sort(own.begin(), own.end(), [&](std::size_t a, std::size_t b) {
    const auto ta = failed_at(records[a]), tb = failed_at(records[b]);
    if (ta != tb) return ta < tb;
    // Same instant: one that wrote its own report first, then the lower rank.
    if (has_report(records[a]) != has_report(records[b])) return has_report(records[a]);
    return records[a].rank < records[b].rank;
  });
  const FailureRecord& earliest = records[own.front()];
  if (!is_teardown_error(error_text(earliest))) return own.front();
  const auto until = failed_at(earliest) + kRootCauseWindow;
  // Its own error file first: a rank that wrote the real error is the best witness.
  for (const bool need_report : {true, false})
    for (const std::size_t i : own) {
      const FailureRecord& r = records[i];
      if (failed_at(r) > until) break;
      if (need_report && !has_report(r)) continue;
      const std::string_view text = error_text(r);
      if (!text.empty() && !is_teardown_error(text)) return i;
      if (text.empty() && r.status.signal != 0) return i;  // a crash with nothing said
    }
  return own.front();
}

namespace {
/// A cgroup pseudo-file (memory.events: small, never a FIFO; O_NONBLOCK all the same), at
/// most 16 KiB; empty when it cannot be read.
std::string read_small(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return {};
  std::string text(16 * 1024, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}
}  // namespace

std::optional<std::uint64_t> read_oom_kill_count(const std::string& path) {
  const std::string text = read_small(path);
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    constexpr std::string_view key = "oom_kill ";
    if (line.substr(0, key.size()) != key) continue;
    const std::string_view value = line.substr(key.size());
    std::uint64_t n = 0;
    const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec == std::errc{} && p == value.data() + value.size()) return n;
  }
  return std::nullopt;
}

std::vector<std::string> memory_event_files(std::string_view proc_cgroup, const std::string& root) {
  std::vector<std::string> out;
  while (!proc_cgroup.empty()) {
    const std::size_t nl = proc_cgroup.find('\n');
    const std::string_view line = proc_cgroup.substr(0, nl);
    proc_cgroup = nl == std::string_view::npos ? std::string_view() : proc_cgroup.substr(nl + 1);
    // "hierarchy-ID:controller-list:cgroup-path"
    const std::size_t c1 = line.find(':');
    const std::size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, c1);
    const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string_view path = line.substr(c2 + 1);
    if (path.empty() || path == "/") continue;  // the root cgroup has no memory.events
    if (id == "0" && controllers.empty()) {
      out.push_back(root + std::string(path) + "/memory.events");
    } else {
      // v1: the controller list is comma-separated ("memory" or e.g. "cpu,memory").
      std::string_view list = controllers;
      while (!list.empty()) {
        const std::size_t comma = list.find(',');
        if (list.substr(0, comma) == "memory") {
          out.push_back(root + "/memory" + std::string(path) + "/memory.oom_control");
          break;
        }
        list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      }
    }
  }
  return out;
}

OomWatch::OomWatch(std::vector<std::string> files) {
  for (auto& f : files) files_.push_back({std::move(f), std::nullopt});
}

OomWatch OomWatch::for_self() {
  return OomWatch(memory_event_files(read_small("/proc/self/cgroup")));
}

void OomWatch::add_process(int pid) {
  if (pid <= 0) return;
  for (auto& f : memory_event_files(read_small(fmt::format("/proc/{}/cgroup", pid)))) {
    if (std::any_of(files_.begin(), files_.end(), [&](const Watched& w) { return w.path == f; }))
      continue;
    const auto base = read_oom_kill_count(f);
    files_.push_back({std::move(f), base});
  }
}

void OomWatch::baseline() {
  for (auto& f : files_) f.base = read_oom_kill_count(f.path);
}

std::optional<std::string> OomWatch::rose() const {
  for (const auto& f : files_) {
    const auto now = read_oom_kill_count(f.path);
    if (!f.base || !now || *now <= *f.base) continue;  // no baseline: nothing to compare
    const std::size_t slash = f.path.rfind('/');
    const std::string dir = slash == std::string::npos ? f.path : f.path.substr(0, slash);
    return fmt::format("cgroup {} oom_kill {}", dir, *now);
  }
  return std::nullopt;
}

std::string oom_kill_sentence(const std::string& counted) {
  return fmt::format("killed by the kernel's out-of-memory killer (host memory; {})", counted);
}

std::optional<std::string> device_oom_sentence(std::string_view text) {
  for (const std::string_view m :
       {"CUDA out of memory", "OutOfMemoryError", "cudaErrorMemoryAllocation"})
    if (text.find(m) != std::string_view::npos)
      return "the GPU ran out of device memory (CUDA out of memory), not the host";
  return std::nullopt;
}

}  // namespace gpurun::supervisor
