// Splits a byte stream (a worker's stdout or stderr) into lines for the
// line-atomic, prefixed console and the per-rank tail.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace gpurun::supervisor {

/// Accumulates bytes and emits complete lines. A line is emitted without its
/// "\n" and without a "\r" right before it (CRLF). A line longer than
/// max_line_bytes is emitted in pieces of max_line_bytes so memory stays bounded.
/// Not thread-safe; the supervisor calls it from its io thread only.
class LineSplitter {
 public:
  using Sink = std::function<void(std::string_view line)>;

  explicit LineSplitter(std::size_t max_line_bytes = 64 * 1024);

  /// Emits every line completed by `data`; keeps the rest buffered.
  void feed(std::string_view data, const Sink& sink);

  /// Emits the buffered partial line, if any (call at EOF).
  void flush(const Sink& sink);

  /// Bytes buffered (an unfinished line).
  std::size_t pending_bytes() const { return buffer_.size(); }

 private:
  std::size_t max_line_bytes_;
  std::string buffer_;
};

}  // namespace gpurun::supervisor
