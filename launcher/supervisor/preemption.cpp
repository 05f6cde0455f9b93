#include "supervisor/preemption.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <sstream>

#include <fmt/format.h>

#include "gpurun/error.hpp"
#include "gpurun/helper_process.hpp"
#include "gpurun/regular_file.hpp"
#include "supervisor/process_spawner.hpp"
#include "supervisor/worker_command.hpp"

namespace gpurun::supervisor {

namespace {

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == s.npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

const std::string* env_get(const EnvMap& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

}  // namespace

std::optional<int> signal_from_name(std::string_view text) {
  std::string name = upper(trim(text));
  if (name.empty()) return std::nullopt;
  if (std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    if (name.size() > 2) return std::nullopt;
    const int n = std::stoi(name);
    if (n < 1 || n > SIGRTMAX) return std::nullopt;
    return n;
  }
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  static const std::pair<const char*, int> kNames[] = {
      {"HUP", SIGHUP},   {"INT", SIGINT},     {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2},   {"PIPE", SIGPIPE}, {"ALRM", SIGALRM},
      {"TERM", SIGTERM}, {"CHLD", SIGCHLD},   {"CONT", SIGCONT}, {"STOP", SIGSTOP},
      {"URG", SIGURG},   {"XCPU", SIGXCPU},   {"XFSZ", SIGXFSZ}, {"VTALRM", SIGVTALRM},
      {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"PWR", SIGPWR},   {"TSTP", SIGTSTP},
  };
  for (const auto& [n, sig] : kNames)
    if (name == n) return sig;
  return std::nullopt;
}

int preempt_signal_flag(std::string_view flag, std::string_view value) {
  if (upper(trim(value)) == "NONE") return 0;
  const std::optional<int> sig = signal_from_name(value);
  if (!sig)
    throw UsageError(fmt::format(
        "invalid value '{}' for --{}: expected a signal name or number (e.g. USR2, SIGUSR2, 12) "
        "or none",
        value, flag));
  switch (*sig) {
    case SIGINT:
    case SIGTERM:
    case SIGQUIT:
    case SIGHUP:
      throw UsageError(fmt::format(
          "invalid value '{}' for --{}: gpurun already uses {} (stop / reload); pick another "
          "signal, e.g. USR2",
          value, flag, signal_name(*sig)));
    case SIGKILL:
    case SIGSTOP:
    case SIGCHLD:
    case SIGPIPE:
    case SIGXFSZ:
    case SIGCONT:
    case SIGTSTP:
      throw UsageError(fmt::format(
          "invalid value '{}' for --{}: {} cannot serve as a warning signal; pick another, e.g. "
          "USR2",
          value, flag, signal_name(*sig)));
    default:
      return *sig;
  }
}

std::optional<std::chrono::seconds> slurm_kill_wait(const EnvMap& env, std::string* source) {
  std::vector<std::string> paths;
  if (const std::string* conf = env_get(env, "SLURM_CONF")) paths.push_back(*conf);
  paths.emplace_back("/etc/slurm/slurm.conf");
  paths.emplace_back("/etc/slurm-llnl/slurm.conf");
  for (const std::string& path : paths) {
    std::istringstream in;
    try {
      const std::optional<FileContent> f = read_regular_file_if_exists(path);
      if (!f) continue;
      in.str(f->bytes);
    } catch (const FileError&) {
      continue;  // a FIFO, a directory, unreadable: as if absent (Slurm's defaults apply)
    }
    if (source) *source = path;
    std::optional<std::chrono::seconds> found;
    std::string line;
    while (std::getline(in, line)) {
      line = line.substr(0, line.find('#'));
      // A line may hold several KEY=VALUE pairs separated by blanks.
      size_t i = 0;
      while (i < line.size()) {
        while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
        size_t j = i;
        while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
        const std::string word = line.substr(i, j - i);
        i = j;
        const auto eq = word.find('=');
        if (eq == word.npos || upper(word.substr(0, eq)) != "KILLWAIT") continue;
        const std::string v = word.substr(eq + 1);
        if (!v.empty() && v.size() < 7 &&
            std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
          found = std::chrono::seconds(std::stoi(v));
      }
    }
    return found;  // the first file that exists is slurmd's; no KillWait there: the default
  }
  return std::nullopt;
}

StopTiming stop_timing(const Options& o, const EnvMap& env) {
  using std::chrono::milliseconds;
  StopTiming t;
  t.stop_timeout = o.stop_timeout.value_or(milliseconds(30'000));
  t.grace_period = o.grace_period;
  if (!env_get(env, "SLURM_JOB_ID")) return t;
  std::string source;
  const std::optional<std::chrono::seconds> kw = slurm_kill_wait(env, &source);
  const milliseconds kill_wait = kw.value_or(std::chrono::seconds(30));
  const std::string from =
      kw ? fmt::format("KillWait={} s from {}", kw->count(), source)
         : fmt::format("KillWait {} s (Slurm's default; {})", kill_wait.count() / 1000,
                       source.empty() ? "no slurm.conf found" : source + " does not set it");
  const milliseconds budget = std::max(milliseconds(2'000), kill_wait - milliseconds(2'000));
  if (!o.stop_timeout && !o.grace_period_given) {
    t.stop_timeout = budget / 2;
    t.grace_period = budget - t.stop_timeout;
  } else if (!o.stop_timeout) {
    t.stop_timeout = std::max(milliseconds(0), budget - t.grace_period);
  } else if (!o.grace_period_given) {
    t.grace_period = std::max(milliseconds(1'000), budget - t.stop_timeout);
  }
  const auto secs = [](milliseconds m) { return fmt::format("{:g} s", m.count() / 1000.0); };
  t.note = fmt::format(
      "Slurm: {}: a SIGTERM stops the workers at their next boundary within --stop-timeout {}, "
      "then SIGTERM, SIGKILL after --grace-period {}",
      from, secs(t.stop_timeout), secs(t.grace_period));
  if (t.stop_timeout + t.grace_period > kill_wait)
    t.note += fmt::format(
        "; warning: together {} exceed KillWait: slurmd may SIGKILL everything before gpurun "
        "is done",
        secs(t.stop_timeout + t.grace_period));
  return t;
}

RequeueResult requeue_job(const EnvMap& env, std::chrono::milliseconds timeout) {
  RequeueResult r;
  const std::string* job = env_get(env, "SLURM_JOB_ID");
  if (!job) {
    r.message = "--requeue: not requeued: SLURM_JOB_ID is not set (not a Slurm job)";
    return r;
  }
  const std::string* path = env_get(env, "PATH");
  const auto exe = find_executable("scontrol", path ? *path : "/usr/local/bin:/usr/bin:/bin");
  if (!exe) {
    r.message = fmt::format(
        "--requeue: not requeued: scontrol is not on PATH (inside a container?); requeue job {} "
        "from outside, e.g. `scontrol requeue {}` in the batch script when gpurun exits with "
        "128+signal (143 for SIGTERM)",
        *job, *job);
    return r;
  }
  HelperOptions o;
  o.argv = {*exe, "requeue", *job};
  std::optional<HelperProcess> scontrol;
  try {
    scontrol.emplace(o);
  } catch (const HelperError& e) {
    r.message = fmt::format("--requeue: not requeued: cannot run {}: {}", *exe,
                            std::strerror(e.error_number()));
    return r;
  }
  std::optional<int> exit;
  try {
    exit = scontrol->wait_for(timeout);
  } catch (const HelperError& e) {
    r.message =
        fmt::format("--requeue: cannot wait for {}: {}", *exe, std::strerror(e.error_number()));
    return r;
  }
  if (!exit) {
    try {
      scontrol->kill_and_wait();
    } catch (const HelperError&) {
      // reaped elsewhere meanwhile: it is gone all the same
    }
    r.message = fmt::format("--requeue: not requeued: `{} requeue {}` gave no answer within {} s",
                            *exe, *job, timeout.count() / 1000);
    return r;
  }
  const int status = *exit;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    r.requeued = true;
    r.message = fmt::format("--requeue: job {} requeued (`{} requeue {}`); exit status {}", *job,
                            *exe, *job, kExitRequeued);
  } else {
    r.message = fmt::format("--requeue: not requeued: `{} requeue {}` failed ({})", *exe, *job,
                            WIFEXITED(status) ? fmt::format("exit status {}", WEXITSTATUS(status))
                                              : signal_name(WTERMSIG(status)));
  }
  return r;
}

}  // namespace gpurun::supervisor
