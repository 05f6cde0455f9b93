#include "supervisor/line_splitter.hpp"

#include "gpurun/check.hpp"

namespace gpurun::supervisor {

namespace {
std::string_view strip_cr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}
}  // namespace

LineSplitter::LineSplitter(std::size_t max_line_bytes, bool redraws)
    : max_line_bytes_(max_line_bytes), redraws_(redraws) {
  GPURUN_CHECK(max_line_bytes > 0, "max_line_bytes must be positive");
}

void LineSplitter::feed(std::string_view data, const Sink& sink) {
  feed_pieces(data, [&](std::string_view text, Piece) { sink(text); });
}

void LineSplitter::flush(const Sink& sink) {
  flush_pieces([&](std::string_view text, Piece) { sink(text); });
}

void LineSplitter::end_segment(const PieceSink& sink) {
  // A "\r" that is not a CRLF: the text so far is one state of a redrawn line.
  if (!buffer_.empty() && buffer_.size() != shown_) {
    sink(buffer_, Piece::kRedraw);
    last_ = buffer_;
  } else if (!buffer_.empty()) {
    last_ = buffer_;
  }
  buffer_.clear();
  shown_ = 0;
  line_redrawn_ = true;
}

void LineSplitter::feed_pieces(std::string_view data, const PieceSink& sink) {
  if (!redraws_) {
    while (!data.empty()) {
      const auto nl = data.find('\n');
      if (nl == std::string_view::npos) {
        // No end of line yet: buffer, emitting full-size pieces of an over-long line.
        while (buffer_.size() + data.size() > max_line_bytes_) {
          const std::size_t take = max_line_bytes_ - buffer_.size();
          buffer_.append(data.substr(0, take));
          data.remove_prefix(take);
          sink(buffer_, Piece::kCut);
          buffer_.clear();
        }
        buffer_.append(data);
        return;
      }
      std::string_view piece = data.substr(0, nl);
      data.remove_prefix(nl + 1);
      if (buffer_.empty() && piece.size() <= max_line_bytes_) {
        sink(strip_cr(piece), Piece::kLine);
        continue;
      }
      buffer_.append(piece);
      std::string_view all = buffer_;
      while (all.size() > max_line_bytes_) {
        sink(all.substr(0, max_line_bytes_), Piece::kCut);
        all.remove_prefix(max_line_bytes_);
      }
      sink(strip_cr(all), Piece::kLine);
      buffer_.clear();
    }
    return;
  }

  // Redraw mode: "\r" and "\n" both end a piece.
  if (pending_cr_ && !data.empty()) {
    pending_cr_ = false;
    if (data.front() == '\n') {
      data.remove_prefix(1);
      sink(buffer_, Piece::kLine);  // "\r\n": a plain line end
      buffer_.clear();
      shown_ = 0;
      line_redrawn_ = false;
      last_.clear();
    } else {
      end_segment(sink);
    }
  }
  while (!data.empty()) {
    const auto end = data.find_first_of("\r\n");
    std::string_view text = data.substr(0, end == std::string_view::npos ? data.size() : end);
    // Over-long: emit full-size pieces (a redrawn line is cut the same way).
    while (buffer_.size() + text.size() > max_line_bytes_) {
      const std::size_t take = max_line_bytes_ - buffer_.size();
      buffer_.append(text.substr(0, take));
      text.remove_prefix(take);
      sink(buffer_, Piece::kCut);
      buffer_.clear();
      shown_ = 0;
      last_.clear();
      line_redrawn_ = false;
    }
    buffer_.append(text);
    if (end == std::string_view::npos) break;
    const char c = data[end];
    data.remove_prefix(end + 1);
    if (c == '\n') {
      sink(buffer_, Piece::kLine);
      buffer_.clear();
      shown_ = 0;
      line_redrawn_ = false;
      last_.clear();
      continue;
    }
    // '\r': a CRLF, or the end of a redrawn segment; at the end of the data: undecided.
    if (data.empty()) {
      pending_cr_ = true;
      break;
    }
    if (data.front() == '\n') {
      data.remove_prefix(1);
      sink(buffer_, Piece::kLine);
      buffer_.clear();
      shown_ = 0;
      line_redrawn_ = false;
      last_.clear();
      continue;
    }
    end_segment(sink);
  }
  // A line being redrawn shows its current text now, not at its next "\r".
  if (line_redrawn_ && !buffer_.empty() && buffer_.size() != shown_) {
    sink(buffer_, Piece::kRedraw);
    shown_ = buffer_.size();
  }
}

void LineSplitter::flush_pieces(const PieceSink& sink) {
  if (pending_cr_) {
    pending_cr_ = false;
    if (!buffer_.empty()) last_ = buffer_;
    buffer_.clear();
    line_redrawn_ = true;
  }
  std::string rest;
  rest.swap(buffer_);
  if (rest.empty() && line_redrawn_) rest.swap(last_);  // the redrawn line's last state
  const bool had = !rest.empty();
  buffer_.clear();
  last_.clear();
  shown_ = 0;
  line_redrawn_ = false;
  if (had) sink(rest, Piece::kEnd);
}

}  // namespace gpurun::supervisor
