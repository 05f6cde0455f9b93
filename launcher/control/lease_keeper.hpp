// gpurun::control::LeaseKeeper — the supervisor's side of `gpurun lend` / `gpurun reclaim`:
// watches <run_dir>/leases.json, ends leases when their time is up, and says what changed.
// The file's read-modify-write (lock + atomic rename) is shared with the commands.
// Reference: docs/sharing.md.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "control/config_watcher.hpp"
#include "control/policy.hpp"
#include "gpurun/clock.hpp"
#include "gpurun/regular_file.hpp"

namespace gpurun::control {

/// `<run_dir>/leases.json`.
std::string leases_path(const std::string& run_dir);

/// Reads, changes and rewrites the leases file under an exclusive lock (flock on
/// `<file>.lock`), atomically (temp file + rename, gpurun::replace_file_if_unchanged).
/// `change` gets the current leases (none when the file is missing) and returns the new ones;
/// should the file change between the read and the rename (a hand edit: gpurun's own writers
/// hold the lock), it is read again and `change` runs again, up to 5 times, so `change` must
/// compute its result from its argument alone. Returns the leases written. Blocks on file
/// I/O and the lock. Throws LeaseError naming the file on an I/O error, a malformed file, a
/// file that is not a regular file (a FIFO, /dev/zero: gpurun::read_regular_file) or one
/// that kept changing. `hook`: the test seam of replace_file_if_unchanged.
std::vector<Lease> update_leases(
    const std::string& path, const std::function<std::vector<Lease>(std::vector<Lease>)>& change,
    const ReplaceHook& hook = {});
/// The leases in the file (none when it is missing). Never blocks on a FIFO or a device.
/// Throws LeaseError.
std::vector<Lease> read_leases(const std::string& path);

/// Unix time now, ms.
int64_t unix_now_ms();
/// A lease end as local time, "12:00:05" (today) or "2026-12-05 12:00:05".
std::string lease_time_text(int64_t unix_ms);

/// Runs on the supervisor's io thread.
class LeaseKeeper {
 public:
  /// What changed, for the console and the event log: `event` "lease" (made) or "lease_end";
  /// `lease` the lease; `why` for an end: "expired" or "reclaimed".
  struct Change {
    std::string event;
    Lease lease;
    std::string why;
  };
  /// `on_change` runs after the set of running leases changed (never inside the constructor).
  /// `on_error` gets each new problem with the file (a sentence naming it: "cannot read the
  /// leases file /r/leases.json: it is a FIFO, not a regular file"), once until it changes;
  /// the leases in force stay. `watcher.clock` (nullptr: real time) is the keeper's clock
  /// too: its wall_now() says which leases ended, and its timer ends them (tests advance a
  /// gpurun::FakeClock past a lease's end instead of waiting for it).
  LeaseKeeper(boost::asio::io_context& io, const std::string& run_dir, WatcherOptions watcher,
              std::function<void(const std::vector<Change>&)> on_change,
              std::function<void(const std::string&)> on_error = {});
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  /// The running leases.
  const std::vector<Lease>& leases() const { return leases_; }
  /// The last problem reading the file ("" when none); the leases before it stay in force.
  const std::string& error() const { return error_; }

 private:
  void reload();
  void expire();
  void arm();
  void apply(std::vector<Lease> now, const std::string& end_why);
  void set_error(const std::string& error);

  boost::asio::io_context& io_;
  std::string path_;
  std::function<void(const std::vector<Change>&)> on_change_;
  std::function<void(const std::string&)> on_error_;
  std::vector<Lease> leases_;
  std::string error_;
  std::unique_ptr<gpurun::Clock> own_clock_;  // when the watcher options name no clock
  gpurun::Clock& clock_;
  gpurun::Clock::Timer timer_;
  std::unique_ptr<ConfigWatcher> watcher_;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace gpurun::control
