// gpurun::supervisor::Notifier — `[notify] command`: runs a shell command for each notable
// event, with the event's JSON record on stdin, on a thread of its own so that it never
// blocks the supervisor or training. Reference: docs/sharing.md#notifications.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace gpurun::supervisor {

/// Whether `event` (with its record `record`, one JSON object) is one the command is run for:
/// a `decision` of kind resize (a shrink, grow, park or resume) or exit, `lease`, `lease_end`,
/// `early_stop`, `shutdown` (the job's end), and `worker_exited` of a failed process.
bool notify_wants(std::string_view event, std::string_view record);

class Notifier {
 public:
  /// `command` runs as `/bin/sh -c command` with GPURUN_NOTIFY_EVENT=<event> in its
  /// environment, stdin = the record and a newline, stdout = /dev/null, stderr = a pipe whose
  /// first kMaxStderrBytes of each run go to `warn`, one line each ("notify: [<event>] <line>"),
  /// then a count of the rest. One at a time, in the order posted; a command still running
  /// after `timeout` is killed (SIGKILL, its process group). `warn` gets one sentence for the
  /// first failure (exit status, signal, timeout, spawn error) and for the first record
  /// dropped by a full queue; later ones are counted, not said. Exit 127 or 126 (the shell did
  /// not find the command, or cannot execute it) is said once, and the command is not run for
  /// later events. `warn` runs on the notifier's thread.
  Notifier(std::string command, std::chrono::milliseconds timeout,
           std::function<void(const std::string&)> warn);
  /// Runs what is queued, all of it within one `timeout` from now (a command still running
  /// then is killed, the rest are dropped; both said), then stops the thread. Says how many
  /// wait when any do.
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  /// Queues `record` when notify_wants() says so. Never blocks on the command: at most
  /// kMaxQueued records wait, a further one is dropped. Any thread.
  void post(std::string_view event, std::string_view record);

  /// Records queued but not run, at most.
  static constexpr std::size_t kMaxQueued = 256;
  /// Bytes of a run's stderr forwarded to `warn`; the rest is counted.
  static constexpr std::size_t kMaxStderrBytes = 4096;

  /// Commands that failed and records dropped so far.
  std::pair<int, int> failures() const;

 private:
  void run();
  void run_one(const std::string& event, const std::string& record);
  void failed(const std::string& why);
  void forward_stderr(const std::string& event, const std::string& shown, std::size_t hidden);

  std::string command_;
  std::chrono::milliseconds timeout_;
  std::function<void(const std::string&)> warn_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, std::string>> queue_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point drain_deadline_{};  ///< set when stopping
  int failures_ = 0;
  int dropped_ = 0;
  bool gave_up_ = false;  ///< exit 127/126: later records are not run
  std::thread thread_;
};

}  // namespace gpurun::supervisor
