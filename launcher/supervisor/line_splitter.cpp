#include "supervisor/line_splitter.hpp"

#include "gpurun/check.hpp"

namespace gpurun::supervisor {

namespace {
std::string_view strip_cr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}
}  // namespace

LineSplitter::LineSplitter(std::size_t max_line_bytes) : max_line_bytes_(max_line_bytes) {
  GPURUN_CHECK(max_line_bytes > 0, "max_line_bytes must be positive");
}

void LineSplitter::feed(std::string_view data, const Sink& sink) {
  while (!data.empty()) {
    const auto nl = data.find('\n');
    if (nl == std::string_view::npos) {
      // No end of line yet: buffer, emitting full-size pieces of an over-long line.
      while (buffer_.size() + data.size() > max_line_bytes_) {
        const std::size_t take = max_line_bytes_ - buffer_.size();
        buffer_.append(data.substr(0, take));
        data.remove_prefix(take);
        sink(buffer_);
        buffer_.clear();
      }
      buffer_.append(data);
      return;
    }
    std::string_view piece = data.substr(0, nl);
    data.remove_prefix(nl + 1);
    if (buffer_.empty() && piece.size() <= max_line_bytes_) {
      sink(strip_cr(piece));
      continue;
    }
    buffer_.append(piece);
    std::string_view all = buffer_;
    while (all.size() > max_line_bytes_) {
      sink(all.substr(0, max_line_bytes_));
      all.remove_prefix(max_line_bytes_);
    }
    sink(strip_cr(all));
    buffer_.clear();
  }
}

void LineSplitter::flush(const Sink& sink) {
  if (buffer_.empty()) return;
  std::string rest;
  rest.swap(buffer_);
  sink(rest);
}

}  // namespace gpurun::supervisor
