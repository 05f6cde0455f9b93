#include "supervisor/error_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
// Boost.JSON's implementation is compiled once, in gpurun_json (common/json.cpp).
#include <boost/json.hpp>

#include "gpurun/unique_fd.hpp"

namespace gpurun::supervisor {
namespace {

/// How many bytes of a bad file its problem quotes.
constexpr std::size_t kQuotedBytes = 64;

std::string as_text(const boost::json::value& v) {
  if (v.is_string()) return std::string(v.get_string());
  if (v.is_null()) return {};
  return boost::json::serialize(v);
}

/// The first kQuotedBytes of `content` in quotes: printable ASCII as is, anything else as an
/// escape (\n, \t, \xNN), "..." when there is more.
std::string first_bytes(std::string_view content, bool more_follows = false) {
  std::string out = "'";
  for (std::size_t i = 0; i < content.size() && i < kQuotedBytes; ++i) {
    const auto c = static_cast<unsigned char>(content[i]);
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c >= 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  if (more_follows || content.size() > kQuotedBytes) out += "...";
  return out + "'";
}

/// "line L, column C" of byte `offset` in `content` (both from 1).
std::string position(std::string_view content, std::size_t offset) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < offset && i < content.size(); ++i) {
    if (content[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return fmt::format("line {}, column {}", line, column);
}

/// Why `content` is not a report (parse_error_file returned nullopt for it).
std::string content_problem(std::string_view content) {
  if (content.empty()) return "is empty (the worker may have died while writing it)";
  boost::json::stream_parser parser;
  boost::system::error_code ec;
  const std::size_t used = parser.write_some(content.data(), content.size(), ec);
  if (!ec) parser.finish(ec);
  if (ec)
    return fmt::format("is not valid JSON ({} at {}); first bytes: {}", ec.message(),
                       position(content, used), first_bytes(content));
  return fmt::format(
      "is JSON but not torch's error format (no \"message\" with text); first bytes: {}",
      first_bytes(content));
}

std::string file_type(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

WorkerErrorReport bad_file(const std::string& path, std::string problem) {
  WorkerErrorReport r;
  r.message = fmt::format("error file {} {}", path, problem);
  r.problem = std::move(problem);
  return r;
}

}  // namespace

std::optional<WorkerErrorReport> parse_error_file(std::string_view content) {
  boost::system::error_code ec;
  boost::json::value root = boost::json::parse(content, ec);
  if (ec || !root.is_object()) return std::nullopt;
  const auto* message = root.as_object().if_contains("message");
  if (!message) return std::nullopt;
  WorkerErrorReport report;
  if (message->is_string()) {
    report.message = std::string(message->get_string());
  } else if (message->is_object()) {
    const auto& m = message->as_object();
    if (const auto* text = m.if_contains("message")) report.message = as_text(*text);
    if (const auto* extra = m.if_contains("extraInfo"); extra && extra->is_object()) {
      if (const auto* cs = extra->as_object().if_contains("py_callstack"))
        report.traceback = as_text(*cs);
      if (const auto* ts = extra->as_object().if_contains("timestamp"))
        report.timestamp = as_text(*ts);
    }
  } else {
    return std::nullopt;
  }
  if (report.message.empty() && report.traceback.empty()) return std::nullopt;
  return report;
}

std::optional<WorkerErrorReport> read_error_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;  // not written
    return bad_file(path, fmt::format("cannot be read: {}", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) return bad_file(path, "is a directory, not a file");
  if (!S_ISREG(st.st_mode))
    return bad_file(path, fmt::format("is not a regular file ({})", file_type(st.st_mode)));
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat, open() does not hang.
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return bad_file(path, fmt::format("cannot be read: {}", std::strerror(errno)));
  std::string content(kMaxErrorFileBytes + 1, '\0');
  std::size_t got = 0;
  while (got < content.size()) {
    const ssize_t n = ::read(fd.get(), content.data() + got, content.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return bad_file(path, fmt::format("cannot be read: {}", std::strerror(errno)));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  content.resize(got);
  if (got > kMaxErrorFileBytes) {
    const auto size = static_cast<std::size_t>(st.st_size) > got
                          ? static_cast<std::size_t>(st.st_size)
                          : got;  // at least what was read (the file may be growing)
    return bad_file(path, fmt::format("is {} bytes, over the {}-byte limit; first bytes: {}", size,
                                      kMaxErrorFileBytes, first_bytes(content, true)));
  }
  if (auto report = parse_error_file(content)) {
    struct stat now {};
    if (::fstat(fd.get(), &now) == 0)
      report->written_at = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::seconds(now.st_mtim.tv_sec) +
              std::chrono::nanoseconds(now.st_mtim.tv_nsec)));
    return report;
  }
  return bad_file(path, content_problem(content));
}

}  // namespace gpurun::supervisor
