// gpurun's own stdout and stderr, written by threads of their own: a console nobody reads
// (a paused pager, Ctrl-S, a slow `tee`) never blocks the thread that supervises.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace gpurun::supervisor {

/// Writes text to fds 1 and 2 from one writer thread per destination (fds 1 and 2 share one
/// thread, and so keep their order, when they are the same file: one terminal). `write()`
/// never blocks on a reader: it queues the text, up to `max_pending_bytes` per destination;
/// beyond that, whole submissions are dropped until the queue has drained to half, and then
/// one line on stderr says how many lines and bytes were not shown (and `drop_hint`, where
/// they are kept). A regular file has no reader to wait for: write() writes it itself, at once
/// and in order (a line is there before the caller's next step), and nothing is dropped. Each
/// submission is written whole and in order (a line never mixes with another); the thread writes
/// queued lines of one stream together (one write(2) per MiB at most).
///
/// Thread safety: every member may be called from any thread.
/// Errors: a destination whose reader is gone (EPIPE, EBADF, ...) is dropped silently, as a
/// console that vanished; gpurun goes on.
class ConsoleWriter {
 public:
  struct Options {
    /// Queued bytes per destination before submissions are dropped (bytes).
    size_t max_pending_bytes = 8u << 20;
    /// The descriptors written for stdout and stderr (tests give pipes).
    int out_fd = 1;
    int err_fd = 2;
  };

  /// Starts the writer thread(s).
  explicit ConsoleWriter(Options options);
  /// stop(unbounded): everything queued is written first.
  ~ConsoleWriter();
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  /// Who wrote a text: gpurun itself (its own lines: never dropped) or a worker.
  enum class Origin { kGpurun, kWorker };

  /// Queues `text` for stdout (`fd` 1) or stderr (any other `fd`). Never blocks on the
  /// reader. A worker's text is dropped when the queue is full (returns false); gpurun's own
  /// lines are queued beyond the bound (few, and what the user asked for: a reload, a
  /// failure, the exit status).
  bool write(int fd, std::string_view text, Origin origin = Origin::kGpurun);

  /// Blocks until everything queued so far is written or `limit` has passed; true when
  /// written.
  bool flush(std::chrono::milliseconds limit);

  /// Writes what it can within `limit`, then abandons the rest (a write blocked on the reader
  /// is interrupted) and joins the thread(s). Later writes are dropped. Returns the number of
  /// bytes abandoned (0: everything was written).
  uint64_t stop(std::chrono::milliseconds limit);

  /// At gpurun's exit, after its io loop: waits for the reader to take everything queued,
  /// however long that takes, as any program writing to a pipe does; a stop signal (SIGINT,
  /// SIGTERM, SIGQUIT, SIGHUP) meanwhile gives it `after_stop_signal` more and then abandons
  /// the rest (stop()). Handles those signals while it waits (their dispositions are
  /// restored after). True when everything was written. Main thread only.
  bool drain_at_exit(std::chrono::milliseconds after_stop_signal);

  /// Where dropped lines can still be read, appended to the drop notice (e.g. "the log files
  /// under <dir> have every line"); empty: nothing appended.
  void set_drop_hint(std::string hint);

  /// Lines and bytes dropped so far (both destinations).
  uint64_t dropped_lines() const;
  uint64_t dropped_bytes() const;

  /// The process's installed writer (install()), or null.
  static ConsoleWriter* installed();
  /// Makes `writer` the one console_write() uses (null: none; console_write writes directly).
  static void install(ConsoleWriter* writer);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// gpurun's output to fd 1 or 2: through the installed ConsoleWriter, else a direct blocking
/// write (subcommands, tests). `text` is written whole (one line or more).
void console_write(int fd, std::string_view text);

}  // namespace gpurun::supervisor
