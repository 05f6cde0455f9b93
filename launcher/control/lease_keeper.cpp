// Leases on disk and their timers. Reference: docs/sharing.md.
#include "control/lease_keeper.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <iterator>

#include <fmt/format.h>

#include "gpurun/regular_file.hpp"
#include "gpurun/unique_fd.hpp"
#include "supervisor/asio_clock.hpp"

namespace gpurun::control {

namespace {

/// A leases file is a few hundred bytes per lease: 1 MiB is thousands of them.
constexpr std::size_t kMaxLeasesBytes = std::size_t{1} << 20;
/// Rounds of "the file changed under us: read it again" before update_leases gives up.
constexpr int kUpdateAttempts = 5;

std::optional<FileContent> read_file(const std::string& path) {
  try {
    return read_regular_file_if_exists(path, kMaxLeasesBytes, "the leases file");
  } catch (const FileError& e) {
    throw LeaseError(e.what());
  }
}

std::vector<Lease> parsed(const std::optional<FileContent>& file, const std::string& path) {
  return file ? parse_leases(file->bytes, path) : std::vector<Lease>{};
}

}  // namespace

std::string leases_path(const std::string& run_dir) {
  return run_dir + "/leases.json";
}

int64_t unix_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string lease_time_text(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  const std::time_t now = std::time(nullptr);
  std::tm tm{}, today{};
  if (!::localtime_r(&t, &tm) || !::localtime_r(&now, &today)) return fmt::format("{} ms", unix_ms);
  char buf[32];
  const bool same_day = tm.tm_year == today.tm_year && tm.tm_yday == today.tm_yday;
  std::strftime(buf, sizeof buf, same_day ? "%H:%M:%S" : "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::vector<Lease> read_leases(const std::string& path) {
  return parsed(read_file(path), path);
}

std::vector<Lease> update_leases(
    const std::string& path, const std::function<std::vector<Lease>(std::vector<Lease>)>& change,
    const ReplaceHook& hook) {
  const std::string lock_path = path + ".lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock)
    throw LeaseError(
        fmt::format("{}: cannot open the lock file: {}", lock_path, std::strerror(errno)));
  while (::flock(lock.get(), LOCK_EX) != 0)
    if (errno != EINTR)
      throw LeaseError(fmt::format("{}: cannot lock: {}", lock_path, std::strerror(errno)));
  // gpurun's own writers hold the lock; a hand edit (or another program) does not: the file
  // is replaced only if it still holds what was read, else read again.
  for (int attempt = 1;; ++attempt) {
    const std::optional<FileContent> before = read_file(path);
    std::vector<Lease> next = change(parsed(before, path));
    try {
      if (replace_file_if_unchanged(path, before, render_leases(next), 0644, hook)) return next;
    } catch (const FileError& e) {
      throw LeaseError(e.what());
    }
    if (attempt == kUpdateAttempts)
      throw LeaseError(fmt::format(
          "{}: the leases file changed {} times while gpurun rewrote it (something writes it "
          "without taking {}): nothing was changed; try again",
          path, kUpdateAttempts, lock_path));
  }
}

LeaseKeeper::LeaseKeeper(boost::asio::io_context& io, const std::string& run_dir,
                         WatcherOptions watcher,
                         std::function<void(const std::vector<Change>&)> on_change,
                         std::function<void(const std::string&)> on_error)
    : io_(io),
      path_(leases_path(run_dir)),
      on_change_(std::move(on_change)),
      on_error_(std::move(on_error)),
      own_clock_(watcher.clock ? nullptr : std::make_unique<supervisor::AsioClock>(io)),
      clock_(watcher.clock ? *watcher.clock : *own_clock_) {
  watcher.log = {};
  watcher.clock = &clock_;
  watcher_ = std::make_unique<ConfigWatcher>(io_, path_, watcher, [this] { reload(); });
}

LeaseKeeper::~LeaseKeeper() {
  timer_.cancel();
}

void LeaseKeeper::reload() {
  try {
    std::vector<Lease> now = drop_ended(read_leases(path_), clock_.unix_ms());
    set_error("");
    apply(std::move(now), "reclaimed");
  } catch (const LeaseError& e) {
    set_error(e.what());
  }
}

void LeaseKeeper::set_error(const std::string& error) {
  if (error == error_) return;
  error_ = error;
  if (!error_.empty() && on_error_) on_error_(error_);
}

void LeaseKeeper::expire() {
  std::vector<Lease> now;
  try {
    const int64_t t = clock_.unix_ms();
    now = update_leases(path_, [t](std::vector<Lease> l) { return drop_ended(l, t); });
  } catch (const LeaseError& e) {
    set_error(e.what());
    now = drop_ended(leases_, clock_.unix_ms());  // the time is up whatever the file says
  }
  apply(std::move(now), "expired");
}

void LeaseKeeper::apply(std::vector<Lease> now, const std::string& end_why) {
  std::vector<Change> changes;
  // The same lease (made at the same time, same end and note) with fewer GPUs: a partial
  // reclaim. Said as the end of the GPUs that came back, not as an end and a new lease.
  const auto narrowed = [](const Lease& before, const Lease& after) {
    return before.since_ms == after.since_ms && before.until_ms == after.until_ms &&
           before.note == after.note && after.gpus.size() < before.gpus.size() &&
           std::includes(before.gpus.begin(), before.gpus.end(), after.gpus.begin(),
                         after.gpus.end());
  };
  std::vector<const Lease*> shrunk;
  for (const Lease& l : leases_) {
    if (std::find(now.begin(), now.end(), l) != now.end()) continue;
    const auto n =
        std::find_if(now.begin(), now.end(), [&](const Lease& x) { return narrowed(l, x); });
    Lease back = l;
    if (n != now.end()) {
      back.gpus.clear();
      std::set_difference(l.gpus.begin(), l.gpus.end(), n->gpus.begin(), n->gpus.end(),
                          std::back_inserter(back.gpus));
      shrunk.push_back(&*n);
    }
    changes.push_back(
        {"lease_end", back, l.until_ms && *l.until_ms <= clock_.unix_ms() ? "expired" : end_why});
  }
  for (const Lease& l : now)
    if (std::find(leases_.begin(), leases_.end(), l) == leases_.end() &&
        std::find(shrunk.begin(), shrunk.end(), &l) == shrunk.end())
      changes.push_back({"lease", l, ""});
  leases_ = std::move(now);
  arm();
  if (!changes.empty() && on_change_) on_change_(changes);
}

void LeaseKeeper::arm() {
  timer_.cancel();
  const std::optional<int64_t> end = next_lease_end(leases_, clock_.unix_ms());
  if (!end) return;
  timer_ = clock_.schedule_after(
      std::chrono::milliseconds(std::max<int64_t>(*end - clock_.unix_ms(), 0)),
      [this, alive = std::weak_ptr<int>(alive_)] {
        if (alive.expired()) return;
        expire();
      });
}

}  // namespace gpurun::control
