#include "supervisor/event_log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "supervisor/console_writer.hpp"

#include "gpurun/error.hpp"

namespace gpurun::supervisor {

EventLog::EventLog(const std::string& path, const gpurun::Clock* clock)
    : path_(path), clock_(clock) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error(fmt::format("cannot open event log '{}': {}", path, std::strerror(errno)));
}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

EventLog::EventLog(EventLog&& other) noexcept {
  *this = std::move(other);
}

EventLog& EventLog::operator=(EventLog&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    clock_ = other.clock_;
    observer_ = std::move(other.observer_);
    write_failed_ = other.write_failed_;
    other.fd_ = -1;
  }
  return *this;
}

std::string EventLog::format_timestamp(std::chrono::system_clock::time_point ts) {
  using namespace std::chrono;
  const auto ms = duration_cast<milliseconds>(ts.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  long frac = static_cast<long>(ms % 1000);
  if (frac < 0) {
    frac += 1000;
    secs -= 1;
  }
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
}

std::string EventLog::format_record(std::chrono::system_clock::time_point ts,
                                    std::string_view event, const JsonObject& fields) {
  JsonObject head;
  head.add("ts", format_timestamp(ts)).add("event", event);
  std::string out = head.str();
  if (!fields.empty()) {
    const std::string rest = fields.str();
    out.pop_back();  // '}'
    out += ", ";
    out.append(rest, 1, std::string::npos);  // without '{'
  }
  return out;
}

void EventLog::emit(std::string_view event, const JsonObject& fields) {
  if (fd_ < 0 && !observer_) return;
  const auto ts = clock_ ? clock_->wall_now() : std::chrono::system_clock::now();
  std::string line = format_record(ts, event, fields);
  if (line.size() > kMaxRecordBytes) {
    // One line a reader can still take in: the event, that it was cut, and how big it was.
    const std::size_t size = line.size();
    line = format_record(ts, event,
                         JsonObject()
                             .add("truncated", true)
                             .add("record_bytes", static_cast<int64_t>(size))
                             .add("limit_bytes", static_cast<int64_t>(kMaxRecordBytes)));
  }
  if (observer_) observer_(event, line);
  if (fd_ < 0) return;
  line.push_back('\n');
  // A short write (a nearly full disk) is continued: the rest either fits or fails with the
  // real errno (ENOSPC), which is what the warning names.
  size_t done = 0;
  int err = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      err = n < 0 ? errno : EIO;
      break;
    }
  }
  if (done != line.size() && !write_failed_) {
    write_failed_ = true;
    const std::string msg = fmt::format(
        "gpurun: warning: writing event log '{}' failed: {} ({} of {} bytes of a record "
        "written); the job goes on (later failures are not reported)\n",
        path_, std::strerror(err), done, line.size());
    console_write(2, msg);
  }
}

}  // namespace gpurun::supervisor
