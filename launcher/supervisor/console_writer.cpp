#include "supervisor/console_writer.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace gpurun::supervisor {

namespace {

/// Interrupts a writer thread blocked in write(2) at stop(): a handler that does nothing,
/// installed without SA_RESTART, so the write returns (EINTR or a short count).
int wake_signal() {
  static const int sig = [] {
    const int s = SIGRTMIN + 1;
    struct sigaction sa {};
    sa.sa_handler = [](int) {};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(s, &sa, nullptr);
    return s;
  }();
  return sig;
}

std::atomic<ConsoleWriter*> g_installed{nullptr};

constexpr size_t kBatchBytes = 1u << 20;  // the most one write(2) of the writer carries

/// Blocking write of all of `text`; false when the destination is gone (or `abandon`).
bool write_all(int fd, std::string_view text, const std::atomic<bool>* abandon) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) {
        if (abandon && abandon->load()) return false;
        continue;
      }
      if (errno == EAGAIN) {  // a non-blocking descriptor: wait a little, keep the text whole
        if (abandon && abandon->load()) return false;
        ::usleep(1000);
        continue;
      }
      return false;  // EPIPE, EBADF, ...: the console is gone
    }
    text.remove_prefix(static_cast<size_t>(n));
    if (abandon && abandon->load() && !text.empty()) return false;
  }
  return true;
}

}  // namespace

/// One destination (a file, pipe or terminal) and the thread that writes it.
struct Lane {
  struct Item {
    int which;  // 0: stdout, 1: stderr
    std::string text;
  };
  std::mutex mu;
  std::condition_variable wake;     // the thread: work or stop
  std::condition_variable drained;  // flush(): the queue is empty and nothing is being written
  std::condition_variable room;     // write() to a regular file: the queue has room again
  std::deque<Item> queue;
  size_t pending = 0;    // bytes in `queue` and in the write in progress
  bool writing = false;  // the thread is in write(2)
  bool stopping = false;
  bool dropping = false;                          // dropping until the queue drains to half
  uint64_t dropped_lines = 0, dropped_bytes = 0;  // since the last notice
  bool broken[2] = {false, false};                // [which]: the reader is gone
  bool file = false;  // a regular file: no reader to wait for; written by write() itself
  std::atomic<bool> abandon{false};
  std::atomic<bool> exited{false};
  std::thread thread;
};

struct ConsoleWriter::Impl {
  Options opt;
  std::unique_ptr<Lane> lanes[2];  // [0]: stdout's, [1]: stderr's (null when stdout's serves both)
  std::mutex hint_mu;
  std::string hint;
  std::atomic<uint64_t> total_dropped_lines{0}, total_dropped_bytes{0};

  Lane& lane_of(int which) { return which == 0 || !lanes[1] ? *lanes[0] : *lanes[1]; }
  void run(Lane& lane);
  /// The notice for a lane that dropped (called with its mutex NOT held).
  void notice(uint64_t lines, uint64_t bytes);
  /// notice() for every lane with drops not said yet.
  void announce_drops();
};

void ConsoleWriter::Impl::notice(uint64_t lines, uint64_t bytes) {
  std::string h;
  {
    std::lock_guard<std::mutex> lock(hint_mu);
    h = hint;
  }
  const std::string text = fmt::format(
      "gpurun: warning: the console was not read for a while (a paused pager, Ctrl-S, a slow "
      "pipe): {} line{} ({} bytes) of output were not shown{}{}\n",
      lines, lines == 1 ? "" : "s", bytes, h.empty() ? "" : "; ", h);
  Lane& lane = lane_of(1);
  std::lock_guard<std::mutex> lock(lane.mu);
  if (lane.stopping && lane.abandon) return;
  lane.pending += text.size();  // a notice is never dropped
  lane.queue.push_back({1, text});
  lane.wake.notify_one();
}

void ConsoleWriter::Impl::run(Lane& lane) {
  // Process-directed signals go to the other threads; only the wake signal reaches this one.
  sigset_t mask;
  sigfillset(&mask);
  sigdelset(&mask, wake_signal());
  ::pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  std::unique_lock<std::mutex> lock(lane.mu);
  for (;;) {
    lane.wake.wait(lock, [&] { return !lane.queue.empty() || lane.stopping; });
    if (lane.queue.empty() || lane.abandon) break;  // stopping, and everything is written
    // One write(2) for the queued items of one stream (up to 1 MiB): a burst of worker lines
    // costs a few system calls, not one per line.
    const int which = lane.queue.front().which;
    std::string batch = std::move(lane.queue.front().text);
    lane.queue.pop_front();
    while (!lane.queue.empty() && lane.queue.front().which == which &&
           batch.size() + lane.queue.front().text.size() <= kBatchBytes) {
      batch += lane.queue.front().text;
      lane.queue.pop_front();
    }
    lane.writing = true;
    const bool skip = lane.broken[which];
    const int fd = which == 0 ? opt.out_fd : opt.err_fd;
    lock.unlock();
    bool ok = true;
    if (!skip) ok = write_all(fd, batch, &lane.abandon);
    lock.lock();
    lane.writing = false;
    if (!ok && !lane.abandon) lane.broken[which] = true;
    lane.pending -= batch.size();
    lane.room.notify_all();
    if (lane.dropping && lane.pending <= opt.max_pending_bytes / 2) {
      // The reader is back: say once what it missed.
      const uint64_t lines = lane.dropped_lines, bytes = lane.dropped_bytes;
      lane.dropping = false;
      lane.dropped_lines = lane.dropped_bytes = 0;
      lock.unlock();
      notice(lines, bytes);
      lock.lock();
    }
    if (lane.queue.empty()) lane.drained.notify_all();
  }
  lane.exited = true;
  lane.drained.notify_all();
  lane.room.notify_all();
}

ConsoleWriter::ConsoleWriter(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = options;
  wake_signal();
  struct stat a {
  }, b{};
  const bool same = ::fstat(options.out_fd, &a) == 0 && ::fstat(options.err_fd, &b) == 0 &&
                    a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  impl_->lanes[0] = std::make_unique<Lane>();
  impl_->lanes[0]->file = S_ISREG(a.st_mode);
  if (!same) {
    impl_->lanes[1] = std::make_unique<Lane>();
    impl_->lanes[1]->file = S_ISREG(b.st_mode);
  }
  for (auto& lane : impl_->lanes)
    if (lane) lane->thread = std::thread([this, l = lane.get()] { impl_->run(*l); });
}

ConsoleWriter::~ConsoleWriter() {
  if (installed() == this) install(nullptr);
  stop(std::chrono::milliseconds::max());
}

bool ConsoleWriter::write(int fd, std::string_view text, Origin origin) {
  if (text.empty()) return true;
  const int which = fd == 1 ? 0 : 1;
  Lane& lane = impl_->lane_of(which);
  std::unique_lock<std::mutex> lock(lane.mu);
  if (lane.file && !lane.stopping && lane.queue.empty() && !lane.writing) {
    // A regular file has no reader to wait for: written here and now, in the caller's order
    // (a line is in the file before the caller's next step, as an event log record is).
    if (!lane.broken[which] &&
        !write_all(which == 0 ? impl_->opt.out_fd : impl_->opt.err_fd, text, nullptr))
      lane.broken[which] = true;
    return true;
  }
  if (origin == Origin::kGpurun && !lane.stopping) {
    // gpurun's own lines are few and are what the user asked for (a reload, a failure, the
    // final status): queued beyond the bound, never dropped.
    lane.pending += text.size();
    lane.queue.push_back({which, std::string(text)});
    lane.wake.notify_one();
    return true;
  }
  auto is_full = [&] {
    return lane.pending > 0 && lane.pending + text.size() > impl_->opt.max_pending_bytes;
  };
  // A regular file behind a queued notice: wait for room rather than drop (it never stalls).
  if (lane.file && !lane.exited)
    lane.room.wait(lock, [&] { return !is_full() || lane.stopping || lane.exited; });
  const bool full = is_full();
  if (lane.stopping || lane.dropping || full) {
    const auto lines = static_cast<uint64_t>(std::count(text.begin(), text.end(), '\n'));
    const uint64_t counted = std::max<uint64_t>(lines, 1);
    lane.dropped_lines += counted;
    lane.dropped_bytes += text.size();
    impl_->total_dropped_lines += counted;
    impl_->total_dropped_bytes += text.size();
    if (!lane.stopping) lane.dropping = true;
    return false;
  }
  lane.pending += text.size();
  lane.queue.push_back({which, std::string(text)});
  lane.wake.notify_one();
  return true;
}

bool ConsoleWriter::flush(std::chrono::milliseconds limit) {
  const auto deadline = limit == std::chrono::milliseconds::max()
                            ? std::chrono::steady_clock::time_point::max()
                            : std::chrono::steady_clock::now() + limit;
  bool all = true;
  for (auto& lane : impl_->lanes) {
    if (!lane) continue;
    std::unique_lock<std::mutex> lock(lane->mu);
    auto done = [&] { return (lane->queue.empty() && !lane->writing) || lane->exited; };
    if (deadline == std::chrono::steady_clock::time_point::max())
      lane->drained.wait(lock, done);
    else if (!lane->drained.wait_until(lock, deadline, done))
      all = false;
  }
  return all;
}

void ConsoleWriter::Impl::announce_drops() {
  for (auto& lane : lanes) {
    if (!lane) continue;
    uint64_t lines = 0, bytes = 0;
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      lines = lane->dropped_lines;
      bytes = lane->dropped_bytes;
      lane->dropped_lines = lane->dropped_bytes = 0;
    }
    if (lines > 0) notice(lines, bytes);
  }
}

uint64_t ConsoleWriter::stop(std::chrono::milliseconds limit) {
  impl_->announce_drops();  // while stderr may still take it (a stalled stdout, a file stderr)
  flush(limit);
  uint64_t abandoned = 0;
  for (auto& lane : impl_->lanes) {
    if (!lane || !lane->thread.joinable()) continue;
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      lane->stopping = true;
      if (!lane->queue.empty() || lane->writing) {
        lane->abandon = true;
        abandoned += lane->pending;
        lane->queue.clear();
      }
      lane->wake.notify_all();
      lane->room.notify_all();
    }
    // A write blocked on the reader returns on the wake signal (no SA_RESTART).
    while (!lane->exited.load()) {
      ::pthread_kill(lane->thread.native_handle(), wake_signal());
      std::unique_lock<std::mutex> lock(lane->mu);
      lane->drained.wait_for(lock, std::chrono::milliseconds(10),
                             [&] { return lane->exited.load(); });
    }
    lane->thread.join();
  }
  return abandoned;
}

void ConsoleWriter::set_drop_hint(std::string hint) {
  std::lock_guard<std::mutex> lock(impl_->hint_mu);
  impl_->hint = std::move(hint);
}

uint64_t ConsoleWriter::dropped_lines() const {
  return impl_->total_dropped_lines;
}
uint64_t ConsoleWriter::dropped_bytes() const {
  return impl_->total_dropped_bytes;
}

ConsoleWriter* ConsoleWriter::installed() {
  return g_installed.load();
}
void ConsoleWriter::install(ConsoleWriter* writer) {
  g_installed.store(writer);
}

namespace {
volatile sig_atomic_t g_exit_stop_signal = 0;
}  // namespace

bool ConsoleWriter::drain_at_exit(std::chrono::milliseconds after_stop_signal) {
  // The io loop and its signal handling are over: a stop signal now would end gpurun by its
  // default action, losing the job's exit status and the console's last lines.
  constexpr int kStops[] = {SIGINT, SIGTERM, SIGQUIT, SIGHUP};
  struct sigaction sa {
  }, old[4];
  sa.sa_handler = [](int sig) { g_exit_stop_signal = sig; };
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 4; ++i) ::sigaction(kStops[i], &sa, &old[i]);
  bool drained = false;
  for (;;) {
    if (flush(std::chrono::milliseconds(100))) {
      drained = true;
      break;
    }
    if (g_exit_stop_signal != 0) {
      stop(after_stop_signal);
      break;
    }
  }
  for (int i = 0; i < 4; ++i) ::sigaction(kStops[i], &old[i], nullptr);
  return drained;
}

void console_write(int fd, std::string_view text) {
  if (ConsoleWriter* w = ConsoleWriter::installed()) {
    w->write(fd, text);
    return;
  }
  write_all(fd, text, nullptr);
}

}  // namespace gpurun::supervisor
