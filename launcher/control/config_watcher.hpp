// gpurun::control::ConfigWatcher — tells the supervisor when config.toml may have changed.
// Which edits are seen and how: docs/config.md#how-changes-are-picked-up.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

#include "gpurun/clock.hpp"

namespace gpurun::control {

/// Tuning of ConfigWatcher. Defaults suit an interactive user editing the file.
struct WatcherOptions {
  /// Quiet time after the last change event before on_change runs, so that a burst of writes
  /// (an editor saving, `cp` writing in chunks) yields one call. While the file is still open
  /// for writing (modified, not yet closed) the call is held back further, up to 10x debounce
  /// after the first event of the burst.
  std::chrono::milliseconds debounce{200};
  /// The quiet time instead of `debounce` when the burst's last event says the writer is done
  /// with the file (closed after writing, or renamed into place: an editor's save, `mv`), so
  /// that an edit takes effect at once; a write that follows within `settle` still joins the
  /// burst. Longer than `debounce` is taken as `debounce`.
  std::chrono::milliseconds settle{25};
  /// How often the file is stat()ed and hashed. This is the only source of changes when
  /// inotify is unavailable or force_polling is set; with inotify it is a backstop for
  /// filesystems that do not report remote edits (NFS, Lustre: a file edited on a login node).
  std::chrono::milliseconds poll_interval{1000};
  /// Never use inotify (tests; filesystems known to lack it).
  bool force_polling = false;
  /// The time of the debounce window and the poll, and their timers, which run on io's
  /// thread; tests pass a gpurun::FakeClock and advance it on that thread. Must outlive the
  /// watcher. nullptr: a supervisor::AsioClock on io (real time).
  gpurun::Clock* clock = nullptr;
  /// Receives one line per notable watcher event (inotify unavailable, a watch that could not
  /// be added). Runs on io's thread. Empty = silent.
  std::function<void(const std::string&)> log;
};

/// Watches one file on a single-threaded io_context and calls on_change when it may have
/// changed. Uses inotify on the directories along the file's symlink chain, so in-place
/// writes, temp file + rename (editors, `sed -i`), `cp` over it and a Kubernetes-ConfigMap
/// style symlink swap (`..data` re-pointed) are all seen; a file that does not exist yet is
/// seen when it appears. Changes are compared by (mtime, size, inode, device, content hash) in
/// the polling path. on_change runs on io's thread, never inside the constructor, and may run
/// when the content did not change (the caller compares configs). Exceptions thrown by
/// on_change propagate out of io_context::run().
/// Construct, call and destroy on io's thread (or while io is not running).
class ConfigWatcher {
 public:
  /// Starts watching at once. Never throws for a missing file or unavailable inotify (those
  /// fall back to polling); throws std::bad_alloc only.
  ConfigWatcher(boost::asio::io_context& io, const std::filesystem::path& path,
                WatcherOptions options, std::function<void()> on_change);
  /// Stops watching; on_change is not called after this returns.
  ~ConfigWatcher();
  ConfigWatcher(const ConfigWatcher&) = delete;
  ConfigWatcher& operator=(const ConfigWatcher&) = delete;

  /// Asks for one on_change call soon (posted to io, no debounce), whatever the file holds:
  /// the SIGHUP path. Does not block. Thread-safe, but not async-signal-safe (use an
  /// asio::signal_set, not a raw signal handler).
  void request_reload();

  /// true while inotify is the primary source of changes (false: polling only).
  bool using_inotify() const;

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace gpurun::control
