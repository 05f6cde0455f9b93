// ConfigWatcher: inotify along the file's symlink chain + a stat/hash poll, debounced.
// Behaviour: docs/config.md#how-changes-are-picked-up.
#include "control/config_watcher.hpp"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>

#include "control/config.hpp"
#include "gpurun/regular_file.hpp"
#include "supervisor/asio_clock.hpp"

namespace gpurun::control {

namespace detail {

namespace fs = std::filesystem;

/// What the poll compares. Two snapshots differ when the file was replaced (inode, device),
/// rewritten (mtime, size) or edited within the mtime granularity (content hash).
struct FileSnapshot {
  int error = 0;  ///< errno of stat() (0: the file exists)
  int64_t mtime_ns = 0;
  int64_t size_bytes = 0;
  uint64_t inode = 0;
  uint64_t device = 0;
  uint64_t content_hash = 0;  ///< FNV-1a 64 of the content (of nothing past kMaxConfigBytes)

  friend bool operator==(const FileSnapshot&, const FileSnapshot&) = default;
};

/// stat() (following symlinks) and hashes `path`. Blocks on file I/O; never throws.
FileSnapshot take_snapshot(const fs::path& path) {
  FileSnapshot snap;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    snap.error = errno;
    return snap;
  }
  snap.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  snap.size_bytes = static_cast<int64_t>(st.st_size);
  snap.inode = static_cast<uint64_t>(st.st_ino);
  snap.device = static_cast<uint64_t>(st.st_dev);
  if (!S_ISREG(st.st_mode)) return snap;
  uint64_t hash = 0xcbf29ce484222325ULL;
  try {
    // Past the limit (or swapped for a FIFO): the hash of nothing; mtime and size still tell.
    for (const char c : read_regular_file(path, kMaxConfigBytes).bytes)
      hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  } catch (const FileError&) {
  }
  snap.content_hash = hash;
  return snap;
}

/// The directory entries whose change can change what `path` reads as: the path itself, every
/// symlink met while resolving it (and symlinked directories inside link targets, e.g.
/// Kubernetes' `..data`), and the final file. Directories are canonical (watchable); entries
/// whose directory does not exist are left out. Never throws.
std::map<std::string, std::set<std::string>> watch_points(const fs::path& path) {
  std::map<std::string, std::set<std::string>> points;
  const auto add = [&](const fs::path& entry) {
    std::error_code ec;
    const fs::path dir = fs::canonical(entry.parent_path(), ec);
    if (!ec && entry.has_filename()) points[dir.string()].insert(entry.filename().string());
  };
  fs::path current = path;
  add(current);
  constexpr int kMaxHops = 40;  // the kernel's own limit (ELOOP)
  for (int hop = 0; hop < kMaxHops; ++hop) {
    std::error_code ec;
    if (!fs::is_symlink(current, ec)) break;
    fs::path target = fs::read_symlink(current, ec);
    if (ec) break;
    if (target.is_relative()) target = current.parent_path() / target;
    target = target.lexically_normal();
    for (fs::path dir = target.parent_path(); !dir.empty() && dir != dir.parent_path();
         dir = dir.parent_path()) {
      if (fs::is_symlink(dir, ec)) add(dir);
    }
    add(target);
    current = target;
  }
  std::error_code ec;
  const fs::path resolved = fs::canonical(path, ec);
  if (!ec) add(resolved);
  return points;
}

}  // namespace detail

namespace {
constexpr uint32_t kWatchMask = IN_CLOSE_WRITE | IN_MODIFY | IN_ATTRIB | IN_CREATE | IN_DELETE |
                                IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF |
                                IN_ONLYDIR;
/// How long an open-for-writing file may hold back on_change, in debounce periods.
constexpr int kMaxDebouncePeriods = 10;

/// `path` made absolute against the current directory (unchanged if that fails).
std::filesystem::path absolute_path(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  return ec ? path : absolute.lexically_normal();
}
}  // namespace

class ConfigWatcher::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(boost::asio::io_context& io, const std::filesystem::path& path, WatcherOptions options,
       std::function<void()> on_change)
      : io_(io),
        path_(absolute_path(path)),
        options_(std::move(options)),
        on_change_(std::move(on_change)),
        own_clock_(options_.clock ? nullptr : std::make_unique<supervisor::AsioClock>(io)),
        clock_(options_.clock ? *options_.clock : *own_clock_),
        inotify_(io) {}

  void start() {
    snapshot_ = detail::take_snapshot(path_);
    if (!options_.force_polling) start_inotify();
    arm_poll();
  }

  void stop() {
    stopped_ = true;
    on_change_ = nullptr;
    debounce_timer_.cancel();
    poll_timer_.cancel();
    boost::system::error_code ignored;
    inotify_.close(ignored);
  }

  void request_reload() {
    boost::asio::post(io_, [weak = weak_from_this()] {
      const auto self = weak.lock();
      if (!self || self->stopped_) return;
      ++self->debounce_generation_;  // a pending debounced call is covered by this one
      self->fire();
    });
  }

  bool using_inotify() const { return inotify_.is_open(); }

 private:
  void log(const std::string& line) const {
    if (options_.log) options_.log(line);
  }

  void start_inotify() {
    const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) {
      log(fmt::format("config watcher: inotify unavailable ({}); polling {} every {} ms",
                      std::strerror(errno), path_.string(), options_.poll_interval.count()));
      return;
    }
    inotify_.assign(fd);
    refresh_watches();
    if (names_by_wd_.empty()) {
      log(fmt::format("config watcher: cannot watch the directory of {}; polling every {} ms",
                      path_.string(), options_.poll_interval.count()));
      boost::system::error_code ignored;
      inotify_.close(ignored);
      return;
    }
    arm_inotify_wait();
  }

  /// Re-resolves the symlink chain and moves the inotify watches to match.
  void refresh_watches() {
    if (!inotify_.is_open()) return;
    const int fd = inotify_.native_handle();
    const auto wanted = detail::watch_points(path_);
    for (auto it = wd_by_dir_.begin(); it != wd_by_dir_.end();) {
      if (wanted.count(it->first) == 0) {
        ::inotify_rm_watch(fd, it->second);  // EINVAL when the kernel already dropped it
        names_by_wd_.erase(it->second);
        it = wd_by_dir_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [dir, names] : wanted) {
      auto it = wd_by_dir_.find(dir);
      if (it == wd_by_dir_.end()) {
        const int wd = ::inotify_add_watch(fd, dir.c_str(), kWatchMask);
        if (wd < 0) {
          if (failed_dirs_.insert(dir).second) {
            log(fmt::format("config watcher: cannot watch {}: {}", dir, std::strerror(errno)));
          }
          continue;
        }
        it = wd_by_dir_.emplace(dir, wd).first;
      }
      names_by_wd_[it->second] = names;
    }
  }

  void arm_inotify_wait() {
    inotify_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                        [weak = weak_from_this()](const boost::system::error_code& ec) {
                          const auto self = weak.lock();
                          if (!self || ec || self->stopped_) return;
                          self->on_inotify_readable();
                        });
  }

  void on_inotify_readable() {
    alignas(struct inotify_event) char buffer[16384];
    bool relevant = false;
    bool rescan = false;
    bool done = false;  // the last relevant event: the writer closed or renamed the file
    while (true) {
      const ssize_t n = ::read(inotify_.native_handle(), buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {
        log(fmt::format("config watcher: reading inotify events failed ({}); polling every {} ms",
                        n < 0 ? std::strerror(errno) : "end of file",
                        options_.poll_interval.count()));
        boost::system::error_code ignored;
        inotify_.close(ignored);
        return;
      }
      for (char* p = buffer; p < buffer + n;) {
        const auto* event = reinterpret_cast<const struct inotify_event*>(p);
        p += sizeof(struct inotify_event) + event->len;
        if (event->mask & IN_Q_OVERFLOW) {
          relevant = rescan = true;
          continue;
        }
        const auto names = names_by_wd_.find(event->wd);
        if (names == names_by_wd_.end()) continue;
        if (event->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) {
          relevant = rescan = true;  // a watched directory went away
          continue;
        }
        if (event->len == 0 || names->second.count(event->name) == 0) continue;
        relevant = true;
        done = (event->mask & (IN_CLOSE_WRITE | IN_MOVED_TO)) != 0;
        if (event->mask & IN_MODIFY) write_open_ = true;
        if (event->mask & (IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM)) {
          write_open_ = false;
        }
        if (event->mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)) rescan = true;
      }
    }
    if (rescan) refresh_watches();
    if (relevant) note_change(done);
    arm_inotify_wait();
  }

  void arm_poll() {
    poll_timer_ = clock_.schedule_after(options_.poll_interval, [weak = weak_from_this()] {
      const auto self = weak.lock();
      if (!self || self->stopped_) return;
      self->on_poll();
    });
  }

  void on_poll() {
    detail::FileSnapshot now = detail::take_snapshot(path_);
    if (!(now == snapshot_)) {
      snapshot_ = now;
      refresh_watches();  // inotify missed it: the chain may have moved
      note_change();
    }
    arm_poll();
  }

  /// Starts or extends the debounce window; `writer_done` (the file was closed after writing
  /// or renamed into place): the shorter `settle` window.
  void note_change(bool writer_done = false) {
    if (!change_pending_) {
      change_pending_ = true;
      burst_start_ = clock_.now();
    }
    arm_debounce(writer_done && !write_open_ ? std::min(options_.settle, options_.debounce)
                                             : options_.debounce);
  }

  void arm_debounce() { arm_debounce(options_.debounce); }
  void arm_debounce(std::chrono::milliseconds quiet) {
    const uint64_t generation = ++debounce_generation_;
    debounce_timer_ = clock_.schedule_after(quiet, [weak = weak_from_this(), generation] {
      const auto self = weak.lock();
      if (!self || self->stopped_ || generation != self->debounce_generation_) return;
      self->on_debounce();
    });
  }

  void on_debounce() {
    const auto cap = burst_start_ + kMaxDebouncePeriods * options_.debounce;
    if (write_open_ && clock_.now() < cap) {
      arm_debounce();  // modified but not closed yet: the writer is still at it
      return;
    }
    fire();
  }

  void fire() {
    change_pending_ = false;
    write_open_ = false;
    snapshot_ = detail::take_snapshot(path_);
    if (on_change_) {
      const auto callback = on_change_;  // on_change may destroy the watcher
      callback();
    }
  }

  boost::asio::io_context& io_;
  const std::filesystem::path path_;
  const WatcherOptions options_;
  std::function<void()> on_change_;
  bool stopped_ = false;
  std::unique_ptr<gpurun::Clock> own_clock_;  // when options_.clock is nullptr
  gpurun::Clock& clock_;                      // declared before the Timers it runs

  boost::asio::posix::stream_descriptor inotify_;
  std::map<std::string, int> wd_by_dir_;
  std::map<int, std::set<std::string>> names_by_wd_;
  std::set<std::string> failed_dirs_;

  gpurun::Clock::Timer debounce_timer_;
  gpurun::Clock::Timer poll_timer_;
  uint64_t debounce_generation_ = 0;
  bool change_pending_ = false;
  bool write_open_ = false;
  gpurun::Clock::TimePoint burst_start_;
  detail::FileSnapshot snapshot_;
};

ConfigWatcher::ConfigWatcher(boost::asio::io_context& io, const std::filesystem::path& path,
                             WatcherOptions options, std::function<void()> on_change)
    : impl_(std::make_shared<Impl>(io, path, std::move(options), std::move(on_change))) {
  impl_->start();
}

ConfigWatcher::~ConfigWatcher() {
  if (impl_) impl_->stop();
}

void ConfigWatcher::request_reload() {
  impl_->request_reload();
}

bool ConfigWatcher::using_inotify() const {
  return impl_->using_inotify();
}

}  // namespace gpurun::control
