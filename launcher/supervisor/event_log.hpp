// gpurun::supervisor::EventLog — the --event-log JSON-lines file.
// Schema: docs/cli.md#event-log. Later components add their own events.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "gpurun/clock.hpp"
#include "gpurun/json_writer.hpp"

namespace gpurun::supervisor {

/// The event log takes its fields as a gpurun::JsonObject (<gpurun/json_writer.hpp>).
using ::gpurun::JsonObject;

/// Appends one JSON object per line: {"ts": "<RFC 3339 UTC, ms>", "event": "<name>", ...fields}.
/// Each record is written with a single write(2) on an O_APPEND descriptor, so
/// records never interleave. A disabled log (default-constructed) drops events.
/// Not thread-safe: call from the supervisor's io thread.
class EventLog {
 public:
  EventLog() = default;
  /// Opens (creates, appends to) `path`. Throws gpurun::Error naming the path on failure.
  /// Records are stamped with `clock`'s wall_now() (it must outlive the log); nullptr: the
  /// system clock.
  explicit EventLog(const std::string& path, const gpurun::Clock* clock = nullptr);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  EventLog(EventLog&& other) noexcept;
  EventLog& operator=(EventLog&& other) noexcept;

  bool enabled() const { return fd_ >= 0; }

  /// Also hands every record (the line's text, without the newline) to `observer`, with the
  /// log file or without one: `[notify]` (supervisor/notifier.hpp). Empty: none.
  using Observer = std::function<void(std::string_view event, const std::string& record)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

  /// Largest record written, in bytes (without the newline). A bigger one is replaced by
  /// {"ts", "event", "truncated": true, "record_bytes": N, "limit_bytes": kMaxRecordBytes}.
  static constexpr std::size_t kMaxRecordBytes = 64 * 1024;

  /// Writes one record (at most kMaxRecordBytes). Write errors are reported once on stderr
  /// ("gpurun: warning: writing event log '<path>' failed: <reason>; …") and then ignored:
  /// the event log never changes the job's outcome.
  void emit(std::string_view event, const JsonObject& fields = {});

  /// The record text without the trailing newline (exposed for tests).
  static std::string format_record(std::chrono::system_clock::time_point ts, std::string_view event,
                                   const JsonObject& fields);

  /// RFC 3339 UTC with milliseconds, e.g. 2025-01-31T12:00:00.123Z.
  static std::string format_timestamp(std::chrono::system_clock::time_point ts);

 private:
  int fd_ = -1;
  std::string path_;
  const gpurun::Clock* clock_ = nullptr;
  bool write_failed_ = false;
  Observer observer_;
};

}  // namespace gpurun::supervisor
